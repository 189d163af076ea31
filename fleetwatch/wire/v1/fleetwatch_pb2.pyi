from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TargetKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_KIND_UNSPECIFIED: _ClassVar[TargetKind]
    TARGET_KIND_NODE: _ClassVar[TargetKind]
    TARGET_KIND_GPU: _ClassVar[TargetKind]
    TARGET_KIND_NVLINK: _ClassVar[TargetKind]
    TARGET_KIND_IB_PORT: _ClassVar[TargetKind]
    TARGET_KIND_PCI: _ClassVar[TargetKind]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_XID: _ClassVar[EventKind]
    EVENT_KIND_GPU_LOST: _ClassVar[EventKind]
    EVENT_KIND_NVLINK_DOWN: _ClassVar[EventKind]
    EVENT_KIND_NVLINK_UP: _ClassVar[EventKind]
    EVENT_KIND_IB_PORT_DOWN: _ClassVar[EventKind]
    EVENT_KIND_IB_PORT_UP: _ClassVar[EventKind]
    EVENT_KIND_PCI_REMOVED: _ClassVar[EventKind]
    EVENT_KIND_PCIE_AER: _ClassVar[EventKind]
    EVENT_KIND_PCI_RECOVERY: _ClassVar[EventKind]
    EVENT_KIND_IB_DEVICE_ADDED: _ClassVar[EventKind]
    EVENT_KIND_IB_DEVICE_REMOVED: _ClassVar[EventKind]
    EVENT_KIND_MACHINE_CHECK: _ClassVar[EventKind]
    EVENT_KIND_FS_ERROR: _ClassVar[EventKind]
    EVENT_KIND_FS_READ_ONLY: _ClassVar[EventKind]
    EVENT_KIND_SXID: _ClassVar[EventKind]
    EVENT_KIND_SXID_FATAL: _ClassVar[EventKind]
    EVENT_KIND_PCIE_AER_UNRECOVERED: _ClassVar[EventKind]
    EVENT_KIND_IB_RATE_LOW: _ClassVar[EventKind]
    EVENT_KIND_ROCE_GID_MISSING: _ClassVar[EventKind]
    EVENT_KIND_PCIE_LINK_DEGRADED: _ClassVar[EventKind]
    EVENT_KIND_MACHINE_CHECK_UNCORRECTED: _ClassVar[EventKind]
    EVENT_KIND_FAN_FAILED: _ClassVar[EventKind]
    EVENT_KIND_FAN_RECOVERED: _ClassVar[EventKind]
    EVENT_KIND_PSU_FAILED: _ClassVar[EventKind]
    EVENT_KIND_PSU_RECOVERED: _ClassVar[EventKind]
    EVENT_KIND_PSU_REDUNDANCY_LOST: _ClassVar[EventKind]
    EVENT_KIND_PSU_REDUNDANCY_RESTORED: _ClassVar[EventKind]
    EVENT_KIND_TEMPERATURE_CRITICAL: _ClassVar[EventKind]
    EVENT_KIND_TEMPERATURE_NORMAL: _ClassVar[EventKind]
    EVENT_KIND_BMC_SEL_ENTRY: _ClassVar[EventKind]
    EVENT_KIND_BMC_SEL_CRITICAL: _ClassVar[EventKind]
    EVENT_KIND_NODE_UNREACHABLE: _ClassVar[EventKind]
    EVENT_KIND_NODE_REACHABLE: _ClassVar[EventKind]

class CommandKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_KIND_UNSPECIFIED: _ClassVar[CommandKind]
    COMMAND_KIND_RESET_GPU: _ClassVar[CommandKind]
    COMMAND_KIND_RUN_DIAGNOSTIC: _ClassVar[CommandKind]
    COMMAND_KIND_DUMP_RANKS: _ClassVar[CommandKind]
TARGET_KIND_UNSPECIFIED: TargetKind
TARGET_KIND_NODE: TargetKind
TARGET_KIND_GPU: TargetKind
TARGET_KIND_NVLINK: TargetKind
TARGET_KIND_IB_PORT: TargetKind
TARGET_KIND_PCI: TargetKind
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_XID: EventKind
EVENT_KIND_GPU_LOST: EventKind
EVENT_KIND_NVLINK_DOWN: EventKind
EVENT_KIND_NVLINK_UP: EventKind
EVENT_KIND_IB_PORT_DOWN: EventKind
EVENT_KIND_IB_PORT_UP: EventKind
EVENT_KIND_PCI_REMOVED: EventKind
EVENT_KIND_PCIE_AER: EventKind
EVENT_KIND_PCI_RECOVERY: EventKind
EVENT_KIND_IB_DEVICE_ADDED: EventKind
EVENT_KIND_IB_DEVICE_REMOVED: EventKind
EVENT_KIND_MACHINE_CHECK: EventKind
EVENT_KIND_FS_ERROR: EventKind
EVENT_KIND_FS_READ_ONLY: EventKind
EVENT_KIND_SXID: EventKind
EVENT_KIND_SXID_FATAL: EventKind
EVENT_KIND_PCIE_AER_UNRECOVERED: EventKind
EVENT_KIND_IB_RATE_LOW: EventKind
EVENT_KIND_ROCE_GID_MISSING: EventKind
EVENT_KIND_PCIE_LINK_DEGRADED: EventKind
EVENT_KIND_MACHINE_CHECK_UNCORRECTED: EventKind
EVENT_KIND_FAN_FAILED: EventKind
EVENT_KIND_FAN_RECOVERED: EventKind
EVENT_KIND_PSU_FAILED: EventKind
EVENT_KIND_PSU_RECOVERED: EventKind
EVENT_KIND_PSU_REDUNDANCY_LOST: EventKind
EVENT_KIND_PSU_REDUNDANCY_RESTORED: EventKind
EVENT_KIND_TEMPERATURE_CRITICAL: EventKind
EVENT_KIND_TEMPERATURE_NORMAL: EventKind
EVENT_KIND_BMC_SEL_ENTRY: EventKind
EVENT_KIND_BMC_SEL_CRITICAL: EventKind
EVENT_KIND_NODE_UNREACHABLE: EventKind
EVENT_KIND_NODE_REACHABLE: EventKind
COMMAND_KIND_UNSPECIFIED: CommandKind
COMMAND_KIND_RESET_GPU: CommandKind
COMMAND_KIND_RUN_DIAGNOSTIC: CommandKind
COMMAND_KIND_DUMP_RANKS: CommandKind

class AgentMessage(_message.Message):
    __slots__ = ("hello", "report", "event", "command_result", "job_report", "preflight_result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    JOB_REPORT_FIELD_NUMBER: _ClassVar[int]
    PREFLIGHT_RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: Report
    event: Event
    command_result: CommandResult
    job_report: JobReport
    preflight_result: PreflightResult
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[Report, _Mapping]] = ..., event: _Optional[_Union[Event, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ..., job_report: _Optional[_Union[JobReport, _Mapping]] = ..., preflight_result: _Optional[_Union[PreflightResult, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "boot_id", "agent_version", "protocol_version", "driver_version", "nvml_version", "gpus", "ib_ports", "time_unix_ms", "resume_seq")
    NODE_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    NVML_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    IB_PORTS_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RESUME_SEQ_FIELD_NUMBER: _ClassVar[int]
    node: str
    boot_id: str
    agent_version: str
    protocol_version: int
    driver_version: str
    nvml_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    ib_ports: _containers.RepeatedCompositeFieldContainer[IbPort]
    time_unix_ms: int
    resume_seq: int
    def __init__(self, node: _Optional[str] = ..., boot_id: _Optional[str] = ..., agent_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., driver_version: _Optional[str] = ..., nvml_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., ib_ports: _Optional[_Iterable[_Union[IbPort, _Mapping]]] = ..., time_unix_ms: _Optional[int] = ..., resume_seq: _Optional[int] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "pci_bus_id", "model", "nvlink_count")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_COUNT_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    pci_bus_id: str
    model: str
    nvlink_count: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., model: _Optional[str] = ..., nvlink_count: _Optional[int] = ...) -> None: ...

class IbPort(_message.Message):
    __slots__ = ("device", "port", "rate", "link_layer")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    device: str
    port: int
    rate: str
    link_layer: str
    def __init__(self, device: _Optional[str] = ..., port: _Optional[int] = ..., rate: _Optional[str] = ..., link_layer: _Optional[str] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("kind", "gpu_uuid", "index", "device")
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    kind: TargetKind
    gpu_uuid: str
    index: int
    device: str
    def __init__(self, kind: _Optional[_Union[TargetKind, str]] = ..., gpu_uuid: _Optional[str] = ..., index: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("time_unix_ms", "samples", "targets")
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    time_unix_ms: int
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    targets: _containers.RepeatedCompositeFieldContainer[TargetSamples]
    def __init__(self, time_unix_ms: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[TargetSamples, _Mapping]]] = ...) -> None: ...

class TargetSamples(_message.Message):
    __slots__ = ("target", "int_signals", "int_values", "real_signals", "real_values", "text_signals", "text_values")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    INT_SIGNALS_FIELD_NUMBER: _ClassVar[int]
    INT_VALUES_FIELD_NUMBER: _ClassVar[int]
    REAL_SIGNALS_FIELD_NUMBER: _ClassVar[int]
    REAL_VALUES_FIELD_NUMBER: _ClassVar[int]
    TEXT_SIGNALS_FIELD_NUMBER: _ClassVar[int]
    TEXT_VALUES_FIELD_NUMBER: _ClassVar[int]
    target: Target
    int_signals: _containers.RepeatedScalarFieldContainer[str]
    int_values: _containers.RepeatedScalarFieldContainer[int]
    real_signals: _containers.RepeatedScalarFieldContainer[str]
    real_values: _containers.RepeatedScalarFieldContainer[float]
    text_signals: _containers.RepeatedScalarFieldContainer[str]
    text_values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., int_signals: _Optional[_Iterable[str]] = ..., int_values: _Optional[_Iterable[int]] = ..., real_signals: _Optional[_Iterable[str]] = ..., real_values: _Optional[_Iterable[float]] = ..., text_signals: _Optional[_Iterable[str]] = ..., text_values: _Optional[_Iterable[str]] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("target", "signal", "int_value", "real_value", "text_value")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    REAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    TEXT_VALUE_FIELD_NUMBER: _ClassVar[int]
    target: Target
    signal: str
    int_value: int
    real_value: float
    text_value: str
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., signal: _Optional[str] = ..., int_value: _Optional[int] = ..., real_value: _Optional[float] = ..., text_value: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "time_unix_ms", "kind", "target", "xid", "xid_class", "detail", "kmsg_seq")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    XID_CLASS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    KMSG_SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_unix_ms: int
    kind: EventKind
    target: Target
    xid: int
    xid_class: str
    detail: str
    kmsg_seq: int
    def __init__(self, seq: _Optional[int] = ..., time_unix_ms: _Optional[int] = ..., kind: _Optional[_Union[EventKind, str]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., xid: _Optional[int] = ..., xid_class: _Optional[str] = ..., detail: _Optional[str] = ..., kmsg_seq: _Optional[int] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("command_id", "ok", "detail", "retry_later", "dumps")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RETRY_LATER_FIELD_NUMBER: _ClassVar[int]
    DUMPS_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    ok: bool
    detail: str
    retry_later: bool
    dumps: _containers.RepeatedCompositeFieldContainer[RankDump]
    def __init__(self, command_id: _Optional[str] = ..., ok: _Optional[bool] = ..., detail: _Optional[str] = ..., retry_later: _Optional[bool] = ..., dumps: _Optional[_Iterable[_Union[RankDump, _Mapping]]] = ...) -> None: ...

class RankDump(_message.Message):
    __slots__ = ("job_id", "rank", "pid", "state", "wchan", "threads", "error", "took_s", "collectives", "recorder_error")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WCHAN_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOOK_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    RECORDER_ERROR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    pid: int
    state: str
    wchan: str
    threads: _containers.RepeatedCompositeFieldContainer[ThreadStack]
    error: str
    took_s: float
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveGroup]
    recorder_error: str
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., wchan: _Optional[str] = ..., threads: _Optional[_Iterable[_Union[ThreadStack, _Mapping]]] = ..., error: _Optional[str] = ..., took_s: _Optional[float] = ..., collectives: _Optional[_Iterable[_Union[CollectiveGroup, _Mapping]]] = ..., recorder_error: _Optional[str] = ...) -> None: ...

class CollectiveGroup(_message.Message):
    __slots__ = ("id", "name", "last_enqueued", "last_started", "last_completed", "recent")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LAST_ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    LAST_STARTED_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    last_enqueued: int
    last_started: int
    last_completed: int
    recent: _containers.RepeatedCompositeFieldContainer[Collective]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., last_enqueued: _Optional[int] = ..., last_started: _Optional[int] = ..., last_completed: _Optional[int] = ..., recent: _Optional[_Iterable[_Union[Collective, _Mapping]]] = ...) -> None: ...

class Collective(_message.Message):
    __slots__ = ("seq", "op", "state")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    op: str
    state: str
    def __init__(self, seq: _Optional[int] = ..., op: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class ThreadStack(_message.Message):
    __slots__ = ("name", "thread_id", "active", "frames")
    NAME_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    name: str
    thread_id: int
    active: bool
    frames: _containers.RepeatedCompositeFieldContainer[StackFrame]
    def __init__(self, name: _Optional[str] = ..., thread_id: _Optional[int] = ..., active: _Optional[bool] = ..., frames: _Optional[_Iterable[_Union[StackFrame, _Mapping]]] = ...) -> None: ...

class StackFrame(_message.Message):
    __slots__ = ("function", "file", "line")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    function: str
    file: str
    line: int
    def __init__(self, function: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ...) -> None: ...

class JobReport(_message.Message):
    __slots__ = ("steps", "dropped", "processes")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[JobStep]
    dropped: int
    processes: _containers.RepeatedCompositeFieldContainer[RankProcess]
    def __init__(self, steps: _Optional[_Iterable[_Union[JobStep, _Mapping]]] = ..., dropped: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[RankProcess, _Mapping]]] = ...) -> None: ...

class RankProcess(_message.Message):
    __slots__ = ("job_id", "rank", "state", "cpu_s", "pid", "farewell", "wchan")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FAREWELL_FIELD_NUMBER: _ClassVar[int]
    WCHAN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    state: str
    cpu_s: float
    pid: int
    farewell: str
    wchan: str
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., state: _Optional[str] = ..., cpu_s: _Optional[float] = ..., pid: _Optional[int] = ..., farewell: _Optional[str] = ..., wchan: _Optional[str] = ...) -> None: ...

class JobStep(_message.Message):
    __slots__ = ("job_id", "rank", "step", "time_unix_ms", "step_time_s", "tokens", "compute_time_s", "gpu_uuid", "world_size", "params", "flops_per_token", "checkpoint_start_unix_ms", "checkpoint_end_unix_ms", "sender_uid", "scheduler_job", "sender_start_unix_ms", "checkpointing")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    FLOPS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_END_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SENDER_UID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_JOB_FIELD_NUMBER: _ClassVar[int]
    SENDER_START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    step: int
    time_unix_ms: int
    step_time_s: float
    tokens: float
    compute_time_s: float
    gpu_uuid: str
    world_size: int
    params: float
    flops_per_token: float
    checkpoint_start_unix_ms: int
    checkpoint_end_unix_ms: int
    sender_uid: int
    scheduler_job: str
    sender_start_unix_ms: int
    checkpointing: bool
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., time_unix_ms: _Optional[int] = ..., step_time_s: _Optional[float] = ..., tokens: _Optional[float] = ..., compute_time_s: _Optional[float] = ..., gpu_uuid: _Optional[str] = ..., world_size: _Optional[int] = ..., params: _Optional[float] = ..., flops_per_token: _Optional[float] = ..., checkpoint_start_unix_ms: _Optional[int] = ..., checkpoint_end_unix_ms: _Optional[int] = ..., sender_uid: _Optional[int] = ..., scheduler_job: _Optional[str] = ..., sender_start_unix_ms: _Optional[int] = ..., checkpointing: _Optional[bool] = ...) -> None: ...

class CollectorMessage(_message.Message):
    __slots__ = ("welcome", "ack", "command", "config", "preflight_task")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PREFLIGHT_TASK_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: Ack
    command: Command
    config: Config
    preflight_task: PreflightTask
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., config: _Optional[_Union[Config, _Mapping]] = ..., preflight_task: _Optional[_Union[PreflightTask, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("collector_version", "journaled", "config", "grouped_reports")
    COLLECTOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    JOURNALED_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    GROUPED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    collector_version: str
    journaled: Ack
    config: Config
    grouped_reports: bool
    def __init__(self, collector_version: _Optional[str] = ..., journaled: _Optional[_Union[Ack, _Mapping]] = ..., config: _Optional[_Union[Config, _Mapping]] = ..., grouped_reports: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("boot_id", "seq")
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    seq: int
    def __init__(self, boot_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class Config(_message.Message):
    __slots__ = ("poll_interval_ms", "heartbeat_interval_ms")
    POLL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    poll_interval_ms: int
    heartbeat_interval_ms: int
    def __init__(self, poll_interval_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("command_id", "kind", "gpu_uuid", "force", "job_id")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    kind: CommandKind
    gpu_uuid: str
    force: bool
    job_id: str
    def __init__(self, command_id: _Optional[str] = ..., kind: _Optional[_Union[CommandKind, str]] = ..., gpu_uuid: _Optional[str] = ..., force: _Optional[bool] = ..., job_id: _Optional[str] = ...) -> None: ...

class PreflightTask(_message.Message):
    __slots__ = ("run_id", "task_id", "level", "checks", "timeout_s", "groups", "ib_tests")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    IB_TESTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    task_id: str
    level: str
    checks: _containers.RepeatedScalarFieldContainer[str]
    timeout_s: float
    groups: _containers.RepeatedCompositeFieldContainer[PreflightGroup]
    ib_tests: _containers.RepeatedCompositeFieldContainer[PreflightIbTest]
    def __init__(self, run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., level: _Optional[str] = ..., checks: _Optional[_Iterable[str]] = ..., timeout_s: _Optional[float] = ..., groups: _Optional[_Iterable[_Union[PreflightGroup, _Mapping]]] = ..., ib_tests: _Optional[_Iterable[_Union[PreflightIbTest, _Mapping]]] = ...) -> None: ...

class PreflightGroup(_message.Message):
    __slots__ = ("check", "nodes", "node_rank", "gpus_per_node", "master_addr", "master_port", "size_bytes", "steps")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    check: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    node_rank: int
    gpus_per_node: int
    master_addr: str
    master_port: int
    size_bytes: int
    steps: int
    def __init__(self, check: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., node_rank: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., size_bytes: _Optional[int] = ..., steps: _Optional[int] = ...) -> None: ...

class PreflightIbTest(_message.Message):
    __slots__ = ("device", "port", "server", "peer", "server_addr", "tcp_port")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    SERVER_ADDR_FIELD_NUMBER: _ClassVar[int]
    TCP_PORT_FIELD_NUMBER: _ClassVar[int]
    device: str
    port: int
    server: bool
    peer: str
    server_addr: str
    tcp_port: int
    def __init__(self, device: _Optional[str] = ..., port: _Optional[int] = ..., server: _Optional[bool] = ..., peer: _Optional[str] = ..., server_addr: _Optional[str] = ..., tcp_port: _Optional[int] = ...) -> None: ...

class PreflightResult(_message.Message):
    __slots__ = ("run_id", "task_id", "refused", "measurements")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    task_id: str
    refused: str
    measurements: _containers.RepeatedCompositeFieldContainer[PreflightMeasurement]
    def __init__(self, run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., refused: _Optional[str] = ..., measurements: _Optional[_Iterable[_Union[PreflightMeasurement, _Mapping]]] = ...) -> None: ...

class PreflightMeasurement(_message.Message):
    __slots__ = ("check", "component", "value", "unit", "text", "error", "evidence")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    check: str
    component: str
    value: float
    unit: str
    text: str
    error: str
    evidence: str
    def __init__(self, check: _Optional[str] = ..., component: _Optional[str] = ..., value: _Optional[float] = ..., unit: _Optional[str] = ..., text: _Optional[str] = ..., error: _Optional[str] = ..., evidence: _Optional[str] = ...) -> None: ...
