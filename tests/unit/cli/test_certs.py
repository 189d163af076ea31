import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cli import issue_certs as certs
from cli.main import main
from fleetwatch.tls import certificate_names

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["certs", *args])
    out, err = capsys.readouterr()
    return code, out, err


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


class TestCertsCommand:
    def test_makes_a_ca_then_node_and_collector_certificates(self, capsys, tmp_path: Path):
        """`certs ca`, `certs node` and `certs collector` write PEM pairs: keys 0600,
        certificates 0644, each saying where it wrote."""
        ca_dir, out = tmp_path / "ca", tmp_path / "out"
        assert run(capsys, "ca", "--out", str(ca_dir))[0] == 0
        code, said, _ = run(capsys, "node", "gpu-017", "--ca", str(ca_dir), "--out", str(out))
        assert code == 0
        assert said.startswith(f"wrote {out / 'gpu-017.pem'} (valid until ")
        code, _, _ = run(
            capsys, "collector", "fw.example,10.0.0.9", "--ca", str(ca_dir), "--out", str(out)
        )
        assert code == 0
        for cert, key in (
            (ca_dir / "ca.pem", ca_dir / "ca.key"),
            (out / "gpu-017.pem", out / "gpu-017.key"),
            (out / "collector-fw.example.pem", out / "collector-fw.example.key"),
        ):
            assert (mode(cert), mode(key)) == (0o644, 0o600)
            assert isinstance(
                load_pem_private_key(key.read_bytes(), None), ec.EllipticCurvePrivateKey
            )

    def test_refuses_to_overwrite(self, capsys, tmp_path: Path):
        """A second run into the same folder fails with one clear line and changes nothing."""
        assert run(capsys, "ca", "--out", str(tmp_path))[0] == 0
        before = (tmp_path / "ca.key").read_bytes()
        code, _, err = run(capsys, "ca", "--out", str(tmp_path))
        assert code == 2
        assert err == (
            f"fleetwatch certs: refusing to overwrite {tmp_path / 'ca.pem'} and "
            f"{tmp_path / 'ca.key'}; choose another --out\n"
        )
        assert (tmp_path / "ca.key").read_bytes() == before
        run(capsys, "node", "n1", "--ca", str(tmp_path), "--out", str(tmp_path))
        (tmp_path / "n1.pem").unlink()  # half a pair is still refused: the key is there
        code, _, err = run(capsys, "node", "n1", "--ca", str(tmp_path), "--out", str(tmp_path))
        assert code == 2
        assert f"refusing to overwrite {tmp_path / 'n1.key'};" in err

    def test_wide_umask_does_not_widen_the_key(self, capsys, tmp_path: Path):
        """Key files are 0600 and certificates 0644 whatever the umask."""
        old = os.umask(0o000)
        try:
            assert run(capsys, "ca", "--out", str(tmp_path))[0] == 0
        finally:
            os.umask(old)
        assert (mode(tmp_path / "ca.pem"), mode(tmp_path / "ca.key")) == (0o644, 0o600)

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["node", "bad name"], "node name 'bad name' is not a host name"),
            (["node", "n" * 65], "at most 64 characters"),
            (["collector", "a b"], "'a b' is neither a host name nor an IP address"),
            (["collector", ","], "name at least one host name"),
            (["node", "n1", "--days", "0"], "validity must be at least 1 day"),
        ],
    )
    def test_bad_requests_are_one_line(self, capsys, tmp_path: Path, args, message):
        """A bad name or validity is refused with a line saying what was wrong."""
        run(capsys, "ca", "--out", str(tmp_path))
        code, _, err = run(capsys, *args, "--ca", str(tmp_path), "--out", str(tmp_path))
        assert code == 2
        assert message in err

    def test_missing_ca_is_named(self, capsys, tmp_path: Path):
        """Without a CA the command says which file it could not read and how to make one."""
        code, _, err = run(capsys, "node", "n1", "--ca", str(tmp_path / "no"), "--out", "x")
        assert code == 2
        assert f"{tmp_path / 'no' / 'ca.pem'}: No such file or directory" in err
        assert "certs ca" in err


class TestCertificates:
    def test_ca_signs_only_end_certificates(self, tmp_path: Path):
        """The CA is a P-256 CA with path length 0, valid ten years from a little before now."""
        written = certs.make_ca(tmp_path, NOW)
        ca = load(written.cert)
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        assert (constraints.ca, constraints.path_length) == (True, 0)
        public = ca.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert public.curve.name == "secp256r1"
        assert ca.not_valid_before_utc == NOW - certs.BACKDATE
        assert ca.not_valid_after_utc == NOW + dt.timedelta(days=3650)

    def test_node_certificate_names_the_node_for_client_auth(self, tmp_path: Path):
        """A node certificate carries the node name as CN and DNS name, is for client auth
        only, is signed by the CA and ends no later than the CA."""
        certs.make_ca(tmp_path, NOW, days=30)
        written = certs.make_node("gpu-017", tmp_path, tmp_path, NOW, days=365)
        cert, ca = load(written.cert), load(tmp_path / "ca.pem")
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-017"
        assert certificate_names(cert) == ("gpu-017",)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert cert.not_valid_after_utc == ca.not_valid_after_utc

    def test_collector_certificate_carries_names_and_addresses(self, tmp_path: Path):
        """Every host name and IP address given is a subject alternative name."""
        certs.make_ca(tmp_path, NOW)
        written = certs.make_collector(["fw.example", "10.0.0.9", "::1"], tmp_path, tmp_path, NOW)
        cert = load(written.cert)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == ["fw.example"]
        assert sans.get_values_for_type(x509.IPAddress) == [
            ipaddress.ip_address("10.0.0.9"),
            ipaddress.ip_address("::1"),
        ]
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
        assert written.not_after == NOW + dt.timedelta(days=365)
