"""Type stubs of the compiled module (use it through ``dualpipe_rs``)."""

from typing import Any, Dict, List, Optional, Tuple, Union

__version__: str

class Schedule:
    """A generated, lowered and validated pipeline schedule."""

    @property
    def kind(self) -> str: ...
    @property
    def ranks(self) -> int: ...
    @property
    def micro_batches(self) -> int: ...
    @property
    def virtual_stages(self) -> int: ...
    @property
    def placement(self) -> List[List[int]]: ...
    @property
    def parameter_copies(self) -> List[int]: ...
    @property
    def programs(self) -> List[List[Dict[str, Any]]]: ...
    @property
    def actions(self) -> List[List[str]]: ...
    def compute_programs(self) -> List[List[Dict[str, Any]]]: ...
    def to_json(self) -> str: ...
    def to_torch_csv(self) -> str: ...
    def simulate(self, **cost: Any) -> Dict[str, Any]: ...
    @staticmethod
    def from_json(text: str) -> "Schedule": ...
    @staticmethod
    def from_torch_csv(text: str, kind: Optional[str] = None) -> "Schedule": ...
    def __len__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...

def schedule(
    kind: str, ranks: int, micro_batches: int, virtual_stages: Optional[int] = None
) -> Schedule: ...
def simulate(
    schedule: Union[str, Schedule],
    ranks: Optional[int] = None,
    micro_batches: Optional[int] = None,
    virtual_stages: Optional[int] = None,
    *,
    f: float = 1.0,
    b: float = 2.0,
    w: float = 1.0,
    fb: Optional[float] = None,
    latency: float = 0.0,
    bandwidth: Optional[float] = None,
    message_bytes: int = 0,
    blocking_comm: bool = False,
) -> Dict[str, Any]: ...

_FlatPlan = Tuple[bytearray, bytearray, bytearray, int]

def eplb_rebalance(
    weight: bytes,
    layers: int,
    experts: int,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    policy: str = "auto",
) -> _FlatPlan: ...
def eplb_rebalance_improved(
    weight: bytes,
    layers: int,
    experts: int,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    previous: Optional[bytes] = None,
) -> Tuple[_FlatPlan, int]: ...
def plan_partition(profile_json: str, stages: int) -> List[int]: ...
