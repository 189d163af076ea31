from pathlib import Path

from cli.main import main

REPO = Path(__file__).resolve().parents[3]


def collector_file(tmp_path: Path, gates: Path) -> Path:
    path = tmp_path / "collector.toml"
    path.write_text(
        "[collector]\n"
        'listen = "127.0.0.1:0"\n'
        'http = "127.0.0.1:0"\n'
        f'journal = "{tmp_path / "journal.db"}"\n'
        f'preflight_gates = "{gates}"\n'
    )
    return path


def test_config_check_reads_the_preflight_gates_file(capsys, tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text((REPO / "rules" / "preflight_gates.yaml").read_text())
    assert main(["config", "check", "--collector", str(collector_file(tmp_path, gates))]) == 0
    capsys.readouterr()


def test_config_check_names_a_broken_gate(capsys, tmp_path):
    gates = tmp_path / "gates.yaml"
    text = (REPO / "rules" / "preflight_gates.yaml").read_text()
    gates.write_text(text.replace("fail_below: 335", "fail_below: 3x5", 1))
    path = collector_file(tmp_path, gates)
    assert main(["config", "check", "--collector", str(path)]) == 2
    _, err = capsys.readouterr()
    line = next(x for x in err.splitlines() if "preflight_gates:" in x)
    assert line.startswith(f"{path}: preflight_gates: {gates}:")
    assert "models.H100.p2p_bw.fail_below: must be a number, not '3x5'" in line
