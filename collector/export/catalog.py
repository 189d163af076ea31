"""Every series the collector's ``/metrics`` exposes: name, type, unit, labels and meaning.

The exporters build their metric families from these specs (:meth:`MetricSpec.family`), so the
catalog cannot drift from what a scrape yields, and ``docs/metrics.md`` is generated from it
(``fleetwatch metrics catalog``; a test checks the committed page is current).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterable

Kind = Literal["gauge", "counter"]

NODE: Final = ("node",)
GPU: Final = ("node", "gpu")
PORT: Final = ("node", "device", "port")
JOB: Final = ("training_job",)
RANK: Final = ("training_job", "rank", "node", "gpu")

NODE_STATES: Final = ("healthy", "degraded", "draining", "drained", "unreachable")
# Series one node of 8 GPUs (18 NVLinks each) and 8 IB ports may cost, job ranks included.
SERIES_PER_NODE_BUDGET: Final = 700


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: ``name`` as exposed (counters end in ``_total``)."""

    name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    help: str
    group: str

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """An empty family of this metric, to add samples to."""
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=list(self.labels))
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))


def _specs(
    group: str, rows: Iterable[tuple[str, Kind, str, tuple[str, ...], str]]
) -> list[MetricSpec]:
    return [
        MetricSpec(name, kind, unit, labels, doc, group) for name, kind, unit, labels, doc in rows
    ]


_NODES = _specs(
    "Nodes",
    [
        (
            "fleetwatch_node_up",
            "gauge",
            "",
            NODE,
            "1 while the node is reachable, 0 once the collector gave up on it.",
        ),
        (
            "fleetwatch_node_connected",
            "gauge",
            "",
            NODE,
            "1 while the node's agent has a stream open to this collector.",
        ),
        (
            "fleetwatch_node_last_seen_timestamp_seconds",
            "gauge",
            "seconds",
            NODE,
            "Unix time of the last message from the node.",
        ),
        (
            "fleetwatch_node_state",
            "gauge",
            "",
            (*NODE, "state"),
            "1 for the node's state, 0 for the others: "
            + ", ".join(NODE_STATES)
            + " (docs/metrics.md says when each holds).",
        ),
        (
            "fleetwatch_node_info",
            "gauge",
            "",
            (*NODE, "agent_version", "driver_version"),
            "Versions the node's agent reported (value always 1).",
        ),
        (
            "fleetwatch_node_events_total",
            "counter",
            "",
            (*NODE, "kind"),
            "Events journaled for the node since this collector started, by kind.",
        ),
        (
            "fleetwatch_node_failures_total",
            "counter",
            "",
            (*NODE, "category"),
            (
                "Failures that interrupt a training job (GPU lost, PCI device removed, node "
                "unreachable, fatal Xid) since this collector started, by category."
            ),
        ),
        (
            "fleetwatch_agent_outbox_pending",
            "gauge",
            "",
            NODE,
            "Events the node's agent holds that the collector has not acknowledged.",
        ),
        (
            "fleetwatch_agent_events_dropped_total",
            "counter",
            "",
            NODE,
            (
                "Events the node's agent dropped: invalid, refused because events alone filled "
                "its spool bound, or left by a previous boot."
            ),
        ),
        (
            "fleetwatch_agent_samples_refused_total",
            "counter",
            "",
            NODE,
            (
                "Samples the node's agent kept back because the collector would refuse them "
                "(not finite, text too long); the signal keeps its last good value."
            ),
        ),
        (
            "fleetwatch_agent_telemetry_dropped_total",
            "counter",
            "",
            NODE,
            (
                "Step reports the node's agent dropped, oldest first, to stay within its spool "
                "bound (or its queue's count) while it could not send them."
            ),
        ),
        (
            "fleetwatch_agent_job_reports_total",
            "counter",
            "",
            NODE,
            (
                "Step reports the node's agent queued from training processes on its job "
                "socket (allowed and well formed; some may be dropped later)."
            ),
        ),
        (
            "fleetwatch_agent_job_reports_lost_total",
            "counter",
            "",
            NODE,
            (
                "Step reports of the node's training processes lost on the way: not sent (the "
                "socket was full; the senders count them), dropped from the agent's full queue, "
                "or refused (fleetwatch_agent_job_reports_refused_total has the reasons)."
            ),
        ),
        (
            "fleetwatch_agent_job_reports_refused_total",
            "counter",
            "",
            (*NODE, "reason"),
            (
                "Step reports the node's agent refused, by reason: what the datagram says "
                "(too_large, not_json, version, missing_field, bad_type, bad_value, "
                "unknown_gpu) or who sent it (no_credentials, sender_gone, job_mismatch: not "
                "the sender's Slurm job; job_owned: another owner holds the job id on the "
                "node; uid_jobs_full, pod_jobs_full, node_jobs_full: the node's bounds on "
                "job ids; owner_ranks_full, node_ranks_full: its bounds on ranks; "
                "uid_connections_full, connections_full: on connections to the job socket, "
                "counted per connection closed). Only reasons seen on the node appear."
            ),
        ),
        (
            "fleetwatch_agent_spool_bytes",
            "gauge",
            "bytes",
            NODE,
            (
                "Bytes the node's agent holds for the collector (spooled events, events the disk "
                "refused, held step reports), against its spool_max_bytes."
            ),
        ),
        (
            "fleetwatch_agent_spool_write_errors_total",
            "counter",
            "",
            NODE,
            (
                "Spool writes the node's disk refused (ENOSPC, EIO); the events wait in memory "
                "and are written again."
            ),
        ),
        (
            "fleetwatch_agent_spool_damaged_total",
            "counter",
            "",
            NODE,
            (
                "Damaged spots (torn or corrupt records, gaps) the node's agent found in its "
                "spool at start; what came before each was kept."
            ),
        ),
        (
            "fleetwatch_agent_kmsg_overruns_total",
            "counter",
            "",
            NODE,
            "Times the kernel log overwrote records before the node's agent read them.",
        ),
        (
            "fleetwatch_agent_ib_resets_total",
            "counter",
            "",
            NODE,
            "IB counters the node's agent saw go backwards (HCA reset, driver reload).",
        ),
        (
            "fleetwatch_agent_nvml_hung",
            "gauge",
            "",
            NODE,
            (
                "1 while an NVML call of the node's agent has passed its nvml_call_timeout and "
                "not returned (a wedged driver): the node's GPU values are stale meanwhile."
            ),
        ),
        (
            "fleetwatch_agent_nvml_calls_timed_out_total",
            "counter",
            "",
            NODE,
            "NVML calls (a poll's GPU reads count as one) that passed the agent's deadline.",
        ),
        (
            "fleetwatch_agent_rss_bytes",
            "gauge",
            "bytes",
            NODE,
            "Resident memory of the node's agent process, in whole MiB.",
        ),
        (
            "fleetwatch_agent_cpu_seconds_total",
            "counter",
            "seconds",
            NODE,
            "CPU time (user and system, every thread) the node's agent process has used.",
        ),
        (
            "fleetwatch_agent_poll_interval_seconds",
            "gauge",
            "seconds",
            NODE,
            (
                "The node's agent's poll interval in force: the configured one, or longer while "
                "its polls cost more CPU than poll_cpu_max_share of it."
            ),
        ),
        (
            "fleetwatch_agent_poll_stretches_total",
            "counter",
            "",
            NODE,
            "Times the node's agent stretched its poll interval because polls cost too much CPU.",
        ),
        (
            "fleetwatch_agent_memory_sheds_total",
            "counter",
            "",
            NODE,
            (
                "Polls at which the node's agent was above memory_max_bytes and dropped the step "
                "reports it held (events are never dropped for memory)."
            ),
        ),
        (
            "fleetwatch_agent_collector_index",
            "gauge",
            "",
            NODE,
            (
                "Which entry of its collectors list the node's agent streams to now (0 is the "
                "first); see fleetwatch_agent_collector_away."
            ),
        ),
        (
            "fleetwatch_agent_collector_away",
            "gauge",
            "",
            NODE,
            (
                "1 while the node's agent streams to another collector than the one its name "
                "picks from its list (it failed over and stays until that one fails too)."
            ),
        ),
        (
            "fleetwatch_agent_collector_failovers_total",
            "counter",
            "",
            NODE,
            "Times the node's agent moved to the next collector of its list since it started.",
        ),
        (
            "fleetwatch_agent_events_coalesced_total",
            "counter",
            "",
            NODE,
            (
                "Xid occurrences the node's agent held back in storms (the same Xid on the same "
                "GPU past its burst): each storm window sent one event that counts them."
            ),
        ),
        (
            "fleetwatch_agent_source_errors_total",
            "counter",
            "",
            (*NODE, "source"),
            "Failed reads by the node's agent, by source (nvml, sysfs, kmsg, udev, bmc).",
        ),
        (
            "fleetwatch_agent_config_last_reload_successful",
            "gauge",
            "",
            NODE,
            (
                "0 when the node's agent refused the files of its last reload (SIGHUP) and runs "
                "the ones before; 1 otherwise."
            ),
        ),
        (
            "fleetwatch_agent_config_reload_failures_total",
            "counter",
            "",
            NODE,
            "Reloads the node's agent refused since it started (bad file; nothing changed).",
        ),
    ],
)

# The node's BMC (agent/poll_bmc.py): one series each per node.
_BMC = _specs(
    "Nodes",
    [
        (
            "fleetwatch_bmc_up",
            "gauge",
            "",
            NODE,
            (
                "1 when the last read of the node's BMC (Redfish or IPMI) succeeded, 0 when it "
                "failed or hung."
            ),
        ),
        (
            "fleetwatch_agent_bmc_hung",
            "gauge",
            "",
            NODE,
            (
                "1 while a read of the node's BMC has passed its [agent.bmc] timeout and not "
                "returned; later reads are skipped meanwhile."
            ),
        ),
        (
            "fleetwatch_bmc_fans",
            "gauge",
            "",
            NODE,
            "Fans the node's BMC reports present.",
        ),
        (
            "fleetwatch_bmc_fans_failed",
            "gauge",
            "",
            NODE,
            "Fans the BMC rates critical or that turn at or below their critical speed.",
        ),
        (
            "fleetwatch_bmc_fan_rpm_min",
            "gauge",
            "",
            NODE,
            "The slowest fan's speed (RPM; percent where the BMC gives only that).",
        ),
        (
            "fleetwatch_bmc_psus",
            "gauge",
            "",
            NODE,
            "Power supplies the BMC lists (empty slots included).",
        ),
        (
            "fleetwatch_bmc_psus_working",
            "gauge",
            "",
            NODE,
            "Power supplies present, not failed and fed: those carrying the node.",
        ),
        (
            "fleetwatch_bmc_psus_failed",
            "gauge",
            "",
            NODE,
            "Power supplies that failed (critical health): they need replacing.",
        ),
        (
            "fleetwatch_bmc_psus_needed",
            "gauge",
            "",
            NODE,
            (
                "Working power supplies the node needs (the BMC's MinNumNeeded, its psus_needed, "
                "or all but one)."
            ),
        ),
        (
            "fleetwatch_bmc_psu_redundancy_lost",
            "gauge",
            "",
            NODE,
            (
                "1 while no spare power supply is left (working at or below needed), or the BMC "
                "says redundancy is lost."
            ),
        ),
        (
            "fleetwatch_bmc_power_watts",
            "gauge",
            "watts",
            NODE,
            "What the node draws, as its BMC reports it.",
        ),
        (
            "fleetwatch_bmc_inlet_temperature_celsius",
            "gauge",
            "celsius",
            NODE,
            "The warmest inlet (intake, ambient) sensor of the node's BMC.",
        ),
        (
            "fleetwatch_bmc_outlet_temperature_celsius",
            "gauge",
            "celsius",
            NODE,
            "The warmest outlet (exhaust) sensor of the node's BMC.",
        ),
        (
            "fleetwatch_bmc_temperature_max_celsius",
            "gauge",
            "celsius",
            NODE,
            "The warmest temperature sensor of the node's BMC.",
        ),
        (
            "fleetwatch_bmc_temperatures_critical",
            "gauge",
            "",
            NODE,
            "BMC temperature sensors at or above their critical threshold.",
        ),
        (
            "fleetwatch_node_gpus_unidentified",
            "gauge",
            "",
            NODE,
            "GPUs NVML counts but could not identify when the agent started (left out).",
        ),
        (
            "fleetwatch_nvswitch_pcie_links_degraded",
            "gauge",
            "",
            NODE,
            "NVSwitches whose PCIe link runs below what the switch and the port above allow.",
        ),
    ],
)

_GPUS = _specs(
    "GPUs",
    [
        (
            "fleetwatch_gpu_info",
            "gauge",
            "",
            (*GPU, "uuid", "pci_bus_id", "model"),
            "Identity of each GPU (value always 1).",
        ),
        (
            "fleetwatch_gpu_present",
            "gauge",
            "",
            GPU,
            "1 while the GPU answers NVML; 0 once it is lost.",
        ),
        ("fleetwatch_gpu_nvlinks", "gauge", "", GPU, "NVLinks the GPU has."),
        ("fleetwatch_gpu_nvlinks_down", "gauge", "", GPU, "NVLinks of the GPU reported down."),
        (
            "fleetwatch_gpu_pcie_replays_total",
            "counter",
            "",
            GPU,
            "PCIe replay counter of the GPU, as NVML reports it.",
        ),
        (
            "fleetwatch_gpu_xid_errors_total",
            "counter",
            "",
            (*GPU, "xid", "class"),
            (
                "Xid errors journaled for the GPU since this collector started, by Xid and its "
                "catalog class; past 16 distinct Xids on one GPU the rest count as "
                'xid="other" (class "other").'
            ),
        ),
        ("fleetwatch_gpu_temperature_celsius", "gauge", "celsius", GPU, "GPU core temperature."),
        (
            "fleetwatch_gpu_nvml_read_failures",
            "gauge",
            "",
            GPU,
            "Polls in a row whose NVML read of the GPU failed (not GPU-lost); 0 once read again.",
        ),
        (
            "fleetwatch_gpu_temperature_slowdown_celsius",
            "gauge",
            "celsius",
            GPU,
            "The temperature at which the GPU slows itself down (NVML's threshold for its model).",
        ),
        ("fleetwatch_gpu_power_watts", "gauge", "watts", GPU, "Board power draw."),
        ("fleetwatch_gpu_utilization_ratio", "gauge", "ratio", GPU, "Share of time a kernel ran."),
        (
            "fleetwatch_gpu_memory_utilization_ratio",
            "gauge",
            "ratio",
            GPU,
            "Share of time device memory was read or written.",
        ),
        ("fleetwatch_gpu_sm_clock_hertz", "gauge", "hertz", GPU, "SM clock."),
        ("fleetwatch_gpu_pcie_link_generation", "gauge", "", GPU, "PCIe link generation now."),
        (
            "fleetwatch_gpu_pcie_link_generation_max",
            "gauge",
            "",
            GPU,
            "Highest PCIe generation of the link.",
        ),
        ("fleetwatch_gpu_pcie_link_width", "gauge", "", GPU, "PCIe lanes in use now."),
        ("fleetwatch_gpu_pcie_link_width_max", "gauge", "", GPU, "PCIe lanes the link can use."),
        (
            "fleetwatch_gpu_pcie_link_width_degraded",
            "gauge",
            "",
            GPU,
            "1 while the PCI function's link runs on fewer lanes than it can (sysfs).",
        ),
        (
            "fleetwatch_gpu_pcie_link_speed_transfers_per_second",
            "gauge",
            "transfers_per_second",
            GPU,
            "PCIe link speed now, per lane (sysfs).",
        ),
        (
            "fleetwatch_gpu_pcie_link_speed_max_transfers_per_second",
            "gauge",
            "transfers_per_second",
            GPU,
            "Highest PCIe link speed per lane (sysfs).",
        ),
        (
            "fleetwatch_gpu_remap_pending",
            "gauge",
            "",
            GPU,
            "1 when a row remap waits for a GPU reset.",
        ),
        ("fleetwatch_gpu_remap_failure", "gauge", "", GPU, "1 when row remapping failed."),
        (
            "fleetwatch_gpu_remapped_rows",
            "gauge",
            "",
            (*GPU, "type"),
            (
                "Memory rows remapped over the GPU's life, by the error that caused it "
                "(correctable, uncorrectable)."
            ),
        ),
        (
            "fleetwatch_gpu_clocks_throttled",
            "gauge",
            "",
            (*GPU, "reason"),
            "1 while the GPU's clocks are held down, by reason (thermal, power, hw_slowdown).",
        ),
        (
            "fleetwatch_gpu_ecc_errors_total",
            "counter",
            "",
            (*GPU, "type"),
            "ECC errors over the GPU's life (aggregate), by type (sbe, dbe).",
        ),
        (
            "fleetwatch_gpu_ecc_volatile_errors_total",
            "counter",
            "",
            (*GPU, "type"),
            "ECC errors since the driver loaded (volatile), by type (sbe, dbe).",
        ),
        (
            "fleetwatch_gpu_nvlink_errors_total",
            "counter",
            "",
            (*GPU, "type"),
            "NVLink data-link errors summed over the GPU's links, by type (replay, recovery, crc).",
        ),
        (
            "fleetwatch_gpu_pcie_aer_errors_total",
            "counter",
            "",
            (*GPU, "severity"),
            "PCIe AER error messages of the GPU's PCI function, by severity.",
        ),
    ],
)

_PORTS = _specs(
    "InfiniBand ports",
    [
        ("fleetwatch_ib_port_up", "gauge", "", PORT, "1 if the InfiniBand port is ACTIVE."),
        (
            "fleetwatch_ib_port_state",
            "gauge",
            "",
            (*PORT, "state", "phys_state"),
            "The port's logical and physical state (value always 1).",
        ),
        ("fleetwatch_ib_port_transmit_bytes_total", "counter", "bytes", PORT, "Bytes sent."),
        ("fleetwatch_ib_port_receive_bytes_total", "counter", "bytes", PORT, "Bytes received."),
        ("fleetwatch_ib_port_transmit_packets_total", "counter", "", PORT, "Packets sent."),
        ("fleetwatch_ib_port_receive_packets_total", "counter", "", PORT, "Packets received."),
        (
            "fleetwatch_ib_port_transmit_wait_total",
            "counter",
            "",
            PORT,
            "Ticks the port had data to send but no credit: congestion (32-bit, saturates).",
        ),
        (
            "fleetwatch_ib_port_link_downed_total",
            "counter",
            "",
            PORT,
            "Times the link went down (8-bit, saturates at 255).",
        ),
        (
            "fleetwatch_ib_port_rate_low",
            "gauge",
            "",
            PORT,
            (
                "1 while the active port runs below its expected rate or width (its own best "
                "since the agent started, or its peers' on the node)."
            ),
        ),
        (
            "fleetwatch_ib_port_roce_v2_gids",
            "gauge",
            "",
            PORT,
            "RoCE v2 entries in a RoCE port's GID table (0: NCCL cannot use the port).",
        ),
        (
            "fleetwatch_ib_port_nic_pcie_link_degraded",
            "gauge",
            "",
            PORT,
            "1 while the port's NIC has a PCIe link below what the card and its slot allow.",
        ),
        (
            "fleetwatch_ib_port_errors_total",
            "counter",
            "",
            (*PORT, "type"),
            (
                "Error counters of the port, by type (the IBA counter each comes from is in "
                "docs/metrics.md)."
            ),
        ),
        (
            "fleetwatch_ib_port_hw_events_total",
            "counter",
            "",
            (*PORT, "counter"),
            (
                "mlx5 hw_counters of the port that show transport trouble and congestion, where "
                "the HCA has them."
            ),
        ),
    ],
)

_JOBS = _specs(
    "Training jobs",
    [
        (
            "fleetwatch_job_tokens_per_second",
            "gauge",
            "",
            JOB,
            "Tokens per second over the recent steps.",
        ),
        (
            "fleetwatch_job_tokens_per_second_per_gpu",
            "gauge",
            "",
            JOB,
            "Tokens per second per GPU.",
        ),
        (
            "fleetwatch_job_mfu_ratio",
            "gauge",
            "ratio",
            JOB,
            "Model FLOPs utilisation (0 when the model size is unknown).",
        ),
        (
            "fleetwatch_job_step_time_seconds",
            "gauge",
            "seconds",
            JOB,
            "Median step time over the recent steps.",
        ),
        ("fleetwatch_job_step", "gauge", "", JOB, "Highest step finished."),
        (
            "fleetwatch_job_state",
            "gauge",
            "",
            (*JOB, "state"),
            (
                "1 for the job's state: running, hung (every rank process there, no step for "
                "longer than its deadline), failed (a rank process ended without saying ok), "
                "finished, idle (nothing heard, no process described); docs/jobs.md, Hangs."
            ),
        ),
        (
            "fleetwatch_job_silent_seconds",
            "gauge",
            "seconds",
            JOB,
            "Time since the job's last finished step.",
        ),
        ("fleetwatch_job_gpus", "gauge", "", JOB, "GPUs (ranks) of the job."),
        (
            "fleetwatch_job_ranks_missing",
            "gauge",
            "",
            JOB,
            (
                "Ranks of the job that stopped reporting while it went on, or whose GPU or node "
                "is gone; its tokens/s counts only the ranks it has."
            ),
        ),
        (
            "fleetwatch_job_ettr_ratio",
            "gauge",
            "ratio",
            JOB,
            "Effective training time ratio since fleetwatch first saw the job.",
        ),
        (
            "fleetwatch_job_goodput_tokens_per_second",
            "gauge",
            "",
            JOB,
            "Tokens of steps that moved the job forward, per second of wall time.",
        ),
        (
            "fleetwatch_job_stragglers",
            "gauge",
            "",
            JOB,
            "Ranks computing slower than the job's median by the margin.",
        ),
        (
            "fleetwatch_job_straggler_lost_gpus",
            "gauge",
            "",
            JOB,
            (
                "GPUs' worth of compute the job loses waiting for its slowest straggler (GPU-hours "
                "lost per hour)."
            ),
        ),
        (
            "fleetwatch_job_throughput_drop_ratio",
            "gauge",
            "ratio",
            JOB,
            "Share of throughput lost in a detected drop (0 when none).",
        ),
        (
            "fleetwatch_job_checkpoint_age_seconds",
            "gauge",
            "seconds",
            JOB,
            "Time since the job's last checkpoint ended.",
        ),
        (
            "fleetwatch_job_checkpoint_cost_seconds",
            "gauge",
            "seconds",
            JOB,
            "Median time a checkpoint takes.",
        ),
        (
            "fleetwatch_job_checkpoint_interval_recommended_seconds",
            "gauge",
            "seconds",
            JOB,
            "Young/Daly checkpoint interval from its nodes' failure rate (0: cost unknown).",
        ),
        (
            "fleetwatch_job_rank_step_time_seconds",
            "gauge",
            "seconds",
            RANK,
            "Each rank's last step time.",
        ),
        (
            "fleetwatch_job_rank_compute_seconds",
            "gauge",
            "seconds",
            RANK,
            "Each rank's compute time in its last step (the step less its waits).",
        ),
        (
            "fleetwatch_job_rank_slowdown_ratio",
            "gauge",
            "ratio",
            RANK,
            "A straggling rank's compute time over the job's median, minus 1 (stragglers only).",
        ),
        ("fleetwatch_job_reports_total", "counter", "", (), "Step reports taken into jobs."),
        (
            "fleetwatch_job_reports_refused_total",
            "counter",
            "",
            ("reason",),
            (
                "Step reports the collector refused, by reason: max_jobs (the job table is "
                "full), uid_jobs (the sender's uid holds its share of it), owner_mismatch "
                "(another Slurm job or uid reports the job), rank_held (another node holds "
                "the rank), beyond_world (the rank is not below the job's world size), "
                "node_ranks (the node's reports hold ranks_per_node ranks already)."
            ),
        ),
    ],
)

_RULES = _specs(
    "Rules, incidents and actions",
    [
        ("fleetwatch_rule_evaluations_total", "counter", "", (), "Rule conditions evaluated."),
        (
            "fleetwatch_rule_evaluation_errors_total",
            "counter",
            "",
            ("rule",),
            "Evaluations of a rule's condition that failed (the rule cannot fire while they do).",
        ),
        (
            "fleetwatch_incidents_open",
            "gauge",
            "",
            ("rule", "severity", "phase"),
            "Incidents pending or firing, by rule, severity and phase.",
        ),
        (
            "fleetwatch_incident_firing",
            "gauge",
            "",
            ("rule", "severity", "scope", "target", "node", "training_job"),
            (
                "1 for each firing incident (node is empty for fleet and job incidents, "
                "training_job for all others): for tables and annotations."
            ),
        ),
        (
            "fleetwatch_actions_total",
            "counter",
            "",
            ("action", "outcome", "node"),
            (
                "Actions that reached an outcome (succeeded, failed, skipped, dry_run, refused: "
                "an argument failed its check or the agent refused for good), by action and node."
            ),
        ),
        (
            "fleetwatch_action_last_timestamp_seconds",
            "gauge",
            "seconds",
            ("action", "outcome", "node"),
            (
                "Unix time of the last action of this kind, outcome and node: for recent-action "
                "tables and annotations."
            ),
        ),
        (
            "fleetwatch_drained_nodes",
            "gauge",
            "",
            (),
            "Nodes fleetwatch has drained and not resumed.",
        ),
        (
            "fleetwatch_drains_waiting",
            "gauge",
            "",
            (),
            "Drains held back by the drain cap or the circuit breaker.",
        ),
        (
            "fleetwatch_drain_cap",
            "gauge",
            "",
            (),
            "How many nodes fleetwatch may drain at once now.",
        ),
        (
            "fleetwatch_drain_breaker_open",
            "gauge",
            "",
            (),
            "1 while the drain circuit breaker is open.",
        ),
        (
            "fleetwatch_actions_deferred_total",
            "counter",
            "",
            (),
            "Times an action was held back to wait (drain cap, breaker, a busy GPU).",
        ),
        (
            "fleetwatch_waiting_drains_dropped_total",
            "counter",
            "",
            (),
            (
                "Drains that waited (drain cap, breaker) and were dropped before they ran because "
                "their rule's condition no longer held: the fault had cleared."
            ),
        ),
        (
            "fleetwatch_incident_recurrences_total",
            "counter",
            "",
            ("rule",),
            (
                "Times a fault recurred while its incident still fired (the rule's "
                "escalate.occurrences grew), by rule; each counts toward the escalation."
            ),
        ),
    ],
)

_COLLECTOR = _specs(
    "The collector itself",
    [
        ("fleetwatch_collector_streams_active", "gauge", "", (), "Agent streams open now."),
        (
            "fleetwatch_collector_messages_rejected_total",
            "counter",
            "",
            ("reason",),
            "Agent messages refused, by reason (the stream is closed with a status).",
        ),
        (
            "fleetwatch_collector_events_journaled_total",
            "counter",
            "",
            (),
            "Events newly written to the journal.",
        ),
        (
            "fleetwatch_collector_events_duplicate_total",
            "counter",
            "",
            (),
            "Events received again after a replay and dropped as duplicates.",
        ),
        (
            "fleetwatch_collector_reports_total",
            "counter",
            "",
            (),
            "Reports received (an empty one is a heartbeat).",
        ),
        (
            "fleetwatch_collector_reports_deferred_total",
            "counter",
            "",
            (),
            (
                "Heavy Reports (a node's first, with all its samples) applied at a later turn "
                "of the event loop than they arrived, so that the other streams were read "
                "meanwhile: many while a fleet reconnects."
            ),
        ),
        (
            "fleetwatch_collector_samples_total",
            "counter",
            "",
            (),
            "Samples received (agents send only changed values).",
        ),
        (
            "fleetwatch_collector_job_steps_total",
            "counter",
            "",
            (),
            "Training-step reports received from agents.",
        ),
        (
            "fleetwatch_collector_seq_gaps_total",
            "counter",
            "",
            (),
            "Streams whose first event skipped numbers the journal never saw.",
        ),
        (
            "fleetwatch_collector_journal_full",
            "gauge",
            "",
            (),
            (
                "1 while the journal's last write failed for want of disk space: events are not "
                "acked (agents keep and resend them) until a commit succeeds again."
            ),
        ),
        (
            "fleetwatch_collector_journal_write_failures_total",
            "counter",
            "",
            ("reason",),
            (
                "Journal writes that failed as a whole, by reason: disk_full (no space: nothing "
                "committed, nothing acked), other (the database down or broken)."
            ),
        ),
        (
            "fleetwatch_api_requests_refused_total",
            "counter",
            "",
            ("reason",),
            (
                "HTTP API requests refused, by reason: a change without the right token "
                "(missing_token, bad_token: 401; no_token_configured, not_loopback: 403); what a "
                "web page could send (bad_host: Host not the collector's, cross_origin: 403; "
                "not_json: 415); bad_request (400, 411, 413, a malformed request); connections "
                "closed too slow to send their request (read_timeout), closed for a newcomer at "
                "the cap (evicted) or refused at the cap (too_many_connections: 503); loop_busy "
                "(503: the event loop did not take the request up in time)."
            ),
        ),
    ],
)

_RELOADS = _specs(
    "Configuration reloads",
    [
        (
            "fleetwatch_config_last_reload_successful",
            "gauge",
            "",
            (),
            (
                "1 when the collector's last reload (SIGHUP) applied its files, 0 when it found "
                "a problem and kept running the files before."
            ),
        ),
        (
            "fleetwatch_config_last_reload_success_timestamp_seconds",
            "gauge",
            "seconds",
            (),
            "Unix time of the last reload that applied its files (or of the start).",
        ),
        (
            "fleetwatch_config_reloads_total",
            "counter",
            "",
            ("result",),
            "Reloads of the collector's config, rule files and Xid catalog, by result.",
        ),
    ],
)

_INGEST = _specs(
    "Ingest budgets and hostile values",
    [
        (
            "fleetwatch_node_ingest_throttled_seconds_total",
            "counter",
            "seconds",
            (*NODE, "budget"),
            (
                "Time the collector stopped reading the node's stream because the node was over "
                "its budget (events or samples per second); what waited stayed with its agent. "
                "Only nodes ever held back or coalesced, at most the 500 most held back."
            ),
        ),
        (
            "fleetwatch_node_events_coalesced_total",
            "counter",
            "",
            NODE,
            (
                "Events of the node journaled as part of one row for a flood of alike events "
                "(the nodes of fleetwatch_node_ingest_throttled_seconds_total)."
            ),
        ),
        (
            "fleetwatch_collector_ingest_throttled_total",
            "counter",
            "",
            ("budget",),
            "Messages after which the collector paused a stream over its budget, by budget.",
        ),
        (
            "fleetwatch_collector_samples_rejected_total",
            "counter",
            "",
            ("reason",),
            (
                "Report samples refused on their own (the rest of the report is taken), by "
                "reason: bad_signal, bad_target, no_value, not_finite, text_too_long, "
                "uneven_columns, wrong_type, negative, out_of_range."
            ),
        ),
        (
            "fleetwatch_collector_bad_times_total",
            "counter",
            "",
            ("reason",),
            (
                "Agent times that cannot be right, by reason: event_time_past (before 2000) and "
                "event_time_future (journaled with the time received instead), "
                "report_time_past, report_time_future, report_time_backwards (counted only)."
            ),
        ),
        (
            "fleetwatch_collector_sample_resets_total",
            "counter",
            "",
            (),
            "Counter samples lower than the value before them, taken as a reset.",
        ),
    ],
)

_PREFLIGHT = _specs(
    "Pre-flight",
    [
        (
            "fleetwatch_preflight_node_verdict",
            "gauge",
            "",
            NODE,
            (
                "The node's verdict in the newest finished pre-flight run that qualified it: "
                "0 pass, 1 warn, 2 fail, 3 could not run."
            ),
        ),
        (
            "fleetwatch_preflight_node_checked_timestamp_seconds",
            "gauge",
            "seconds",
            NODE,
            "Unix time that run finished.",
        ),
        (
            "fleetwatch_preflight_runs_total",
            "counter",
            "",
            ("verdict",),
            "Pre-flight runs finished since the collector started, by the run's verdict.",
        ),
        (
            "fleetwatch_preflight_runs_running",
            "gauge",
            "",
            (),
            "Pre-flight runs in progress.",
        ),
        (
            "fleetwatch_preflight_latest_verdict",
            "gauge",
            "",
            (),
            "The newest finished run's verdict: 0 pass, 1 warn, 2 fail, 3 could not run.",
        ),
        (
            "fleetwatch_preflight_latest_timestamp_seconds",
            "gauge",
            "seconds",
            (),
            "Unix time the newest run finished.",
        ),
        (
            "fleetwatch_preflight_results_refused_total",
            "counter",
            "",
            ("reason",),
            (
                "Pre-flight results, or measurements in them, refused, by reason: "
                "invalid_preflight_result, unknown_task, unknown_check, bad_component, "
                "bad_value, bad_text; and what did not fit the node's plan: not_asked (a check "
                "not asked of it), not_planned (a GPU, port, rail or group not planned for it), "
                "duplicate (a second value of one component)."
            ),
        ),
    ],
)

CATALOG: Final[tuple[MetricSpec, ...]] = (
    *_NODES,
    *_BMC,
    *_GPUS,
    *_PORTS,
    *_JOBS,
    *_RULES,
    *_COLLECTOR,
    *_RELOADS,
    *_INGEST,
    *_PREFLIGHT,
)
BY_NAME: Final[dict[str, MetricSpec]] = {spec.name: spec for spec in CATALOG}


def spec(name: str) -> MetricSpec:
    """The spec of ``name`` (a KeyError names a metric the catalog lacks)."""
    return BY_NAME[name]


def families(names: Iterable[str]) -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """Fresh, empty families of ``names``, by name."""
    return {name: BY_NAME[name].family() for name in names}
