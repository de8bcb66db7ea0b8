# SPDX-License-Identifier: Apache-2.0
"""Typed stubs of the ckv Python module (python/ckv_module.cc). See docs/python.md.

Arrays: K and V are numpy arrays of the spec's dtype (ModelSpec.numpy_dtype): float16 for fp16,
uint16 (the raw bits) for bf16, float32 for fp32; C-contiguous, read in place (CPU torch tensors
too, a torch.bfloat16 one as its raw bits). Token ids are
int32 1-D arrays (used in place) or sequences of ints (copied).
"""
from types import TracebackType
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

Tokens = Union[npt.NDArray[np.int32], Sequence[int]]
Tensor = npt.NDArray[Any]
Tensors = Union[Sequence[Tensor], Tensor]

class Error(Exception):
    """A ckv call failed; code is the absl status code's name, e.g. "NOT_FOUND"."""
    code: str
    def __init__(self, message: str, code: str = "UNKNOWN") -> None: ...

class NotFoundError(Error, LookupError): ...
class InvalidArgumentError(Error, ValueError): ...
class FailedPreconditionError(Error, RuntimeError): ...
class AlreadyExistsError(Error): ...
class DataLossError(Error): ...
class ResourceExhaustedError(Error): ...
class PermissionDeniedError(Error, PermissionError): ...
class UnavailableError(Error): ...
class UnimplementedError(Error, NotImplementedError): ...
class OutOfRangeError(Error, IndexError): ...

class ModelSpec:
    """The shape of a model's KV cache and the identity that binds data to it."""
    def __init__(self, *, layers: int, q_heads: int, kv_heads: int, head_dim: int,
                 dtype: str = "fp16", chunk_tokens: int = 16, model_id: str,
                 codec: str = "none") -> None:
        """A spec from its fields; InvalidArgumentError naming a field out of range."""
    @staticmethod
    def preset(name: str, dtype: str = "fp16", chunk_tokens: int = 16,
               codec: str = "none") -> ModelSpec:
        """A named preset; model_id is the preset's name."""
    @staticmethod
    def preset_names() -> list[str]:
        """The names preset() takes."""
    @property
    def model_id(self) -> str: ...
    @property
    def layers(self) -> int: ...
    @property
    def q_heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def chunk_tokens(self) -> int: ...
    @property
    def dtype(self) -> str:
        """'fp16', 'bf16' or 'fp32'."""
    @property
    def codec(self) -> str:
        """How records are stored: 'none', 'fp8', 'int8' or 'int4'; views decode them."""
    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """float16 (fp16), uint16 (bf16's raw bits) or float32 (fp32)."""
    @property
    def record_bytes(self) -> int:
        """Bytes of one record: K then V of one chunk at one layer."""
    @property
    def fingerprint(self) -> str:
        """The spec's fingerprint, 32 hex digits."""
    def __eq__(self, other: object) -> bool: ...
    def __repr__(self) -> str: ...

def chunk_keys(spec: ModelSpec, tokens: Tokens) -> list[str]:
    """The keys (32 hex digits) of the whole chunks of tokens; the last is put()'s prefix_id."""

class LayerRecord:
    """One selected chunk of a LayerView."""
    @property
    def chunk(self) -> int:
        """Index of the chunk in the prefix (0 = first)."""
    @property
    def first_token(self) -> int:
        """chunk * chunk_tokens."""
    @property
    def k(self) -> Tensor:
        """K [chunk_tokens, kv_heads, head_dim], read-only, over the pinned record (no copy;
        a host copy when the record is in GPU device memory, see copied)."""
    @property
    def v(self) -> Tensor:
        """V, as k."""
    @property
    def tier(self) -> str:
        """'gpu', 'cpu' or 'session'."""
    @property
    def copied(self) -> bool:
        """True when k and v are a host copy of a record in GPU device memory."""
    @property
    def found_in(self) -> str:
        """Where the session found it: 'gpu', 'cpu' or 'session' (read from NVMe)."""
    def __repr__(self) -> str: ...

class LayerView:
    """The selected chunks of one layer; pinned while the view or any of its arrays lives."""
    @property
    def layer(self) -> int: ...
    @property
    def records(self) -> list[LayerRecord]: ...
    @property
    def virtual_tokens(self) -> Optional[dict[str, Any]]:
        """With estimate_rest: chunks [n], keys/values [n, kv_heads, head_dim], bias [n, q_heads]."""
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[LayerRecord]: ...
    def __getitem__(self, i: int) -> LayerRecord: ...

class ReprefillSession:
    """A Re-Prefill session: submit_queries and await_layer per layer, in order, then finish()."""
    @property
    def matched_chunks(self) -> int:
        """Leading whole chunks of the prompt that are stored."""
    def submit_queries(self, layer: int,
                       queries: Optional[npt.NDArray[np.float32]] = None) -> None:
        """Layer `layer`'s suffix queries: float32 [window, q_heads, head_dim], C-contiguous.
        None, only at budget_fraction 1: every matched chunk, nothing scored."""
    def await_layer(self, layer: int) -> LayerView:
        """The selected chunks of `layer`, their K and V as numpy views over the pinned records.
        At budget_fraction 1 a layer with no submit_queries call gets one with None first."""
    def finish(self) -> dict[str, Union[int, float]]:
        """Ends the session; its SessionStats as a dict."""

class Engine:
    """A ckv store, opened. Thread-safe; blocking calls release the GIL."""
    @staticmethod
    def open(path: str, *, max_disk_bytes: Optional[int] = None, gpu_tier_bytes: int = 0,
             cpu_tier_bytes: int = 0, create_if_missing: bool = True,
             error_if_exists: bool = False, remote: Optional[str] = None,
             remote_key_prefix: str = "ckv", remote_call_timeout_ms: int = 500,
             remote_connect_timeout_ms: int = 200) -> Engine:
        """Opens (or creates) the store in `path`; max_disk_bytes None keeps the persisted cap.
        remote: "host:port[,host:port...]" of a Redis Cluster shared with other machines."""
    @staticmethod
    def open_read_only(path: str) -> Engine:
        """Opens the store read-only, beside a writer in another process."""
    @property
    def read_only(self) -> bool: ...
    def close(self) -> None:
        """Closes the engine now, even while sessions live (their later calls raise
        FailedPreconditionError): the store can be opened again at once."""
    def __enter__(self) -> Engine: ...
    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None: ...
    def catch_up(self) -> None:
        """A read-only engine takes a new view of the store."""
    def put(self, spec: ModelSpec, tokens: Tokens, k: Tensors, v: Tensors) -> dict[str, Any]:
        """Stores the whole chunks of tokens; k, v: per-layer [n, kv_heads, head_dim] arrays or
        one [layers, n, kv_heads, head_dim]. A dict of PutResult (prefix_id as hex)."""
    def lookup(self, spec: ModelSpec, tokens: Tokens) -> int:
        """Leading whole chunks of tokens that are stored. With a remote tier, a local miss
        first fetches the rest of the chain from the cluster and stores it here."""
    def probe(self, spec: ModelSpec, tokens: Tokens) -> dict[str, int]:
        """{'local_chunks', 'remote_chunks', 'chunks'}: the leading whole chunks stored here and
        how far the chain continues in the remote tier; fetches and changes nothing."""
    def read_record(self, spec: ModelSpec, key: str, layer: int) -> tuple[Tensor, Tensor]:
        """(k, v) of chunk `key` at `layer`, each [chunk_tokens, kv_heads, head_dim]."""
    def delete(self, spec: ModelSpec, tokens: Tokens) -> None:
        """Drops the stored prefix tokens (a whole number of chunks)."""
    def delete_prefix(self, prefix_id: str) -> None:
        """Drops the prefix list_prefixes() names by id."""
    def list_prefixes(self) -> list[dict[str, Any]]:
        """The stored prefixes, newest first."""
    def verify(self) -> dict[str, Any]:
        """Checks every record's checksum and the catalog's chains: ok, chunks_checked,
        records_checked, bytes_checked, checksum_failures, and problems, each a dict of kind
        ('checksum', 'unreadable', 'damaged' or 'inconsistent'), chunk (hex, or None), layer (or
        None) and message."""
    def begin_reprefill(self, spec: ModelSpec, tokens: Tokens, *, selector: str = "period-exact",
                        budget_fraction: float = 0.1, window: int = 32, period_layers: int = 8,
                        period_selection: bool = False, sink_chunks: int = 1,
                        recent_chunks: int = 1, prefetch: bool = True,
                        estimate_rest: bool = False,
                        target_mass: float = 0.0,
                        rescore_layers: bool = False) -> ReprefillSession:
        """Starts a Re-Prefill of the stored leading chunks of tokens."""
    def stats(self) -> dict[str, Union[int, float, bool]]:
        """EngineStats as a dict."""
    def metrics(self) -> str:
        """The Prometheus text exposition of the engine's figures."""
