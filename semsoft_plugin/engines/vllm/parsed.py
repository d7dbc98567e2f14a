"""One parse of a request's semsoft options per process, found again by its owner's key.

A vLLM request is seen by several steps in one process: the server's admission
middleware, vLLM's admission call, the engine's processor (the same process offline) and
the reader. The one who parses a request (the middleware, which mints its
`semsoft_row_key`; `sampling_params`, which mints one too; the processor, for a
request it meets first) keeps the parsed object here under that row key, and every
later step looks it up there instead of parsing the keys again. Keyed by the request's
own minted key, never by what its options look like; bounded (`CACHE_SIZE`) and freed
by its owner when the request ends. A request without a row key (`SamplingParams` built
by hand) is parsed where it is met. The server's middleware keeps the engine's config
with it: vLLM's admission call, which hands over the `SamplingParams` only, finds it
there (`kept_config`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from semsoft_plugin.core.request import KEY_ROW_KEY, SemsoftRequest, parse_request
from semsoft_plugin.engines.scoring import CACHE_SIZE

__all__ = ["forget", "keep", "kept_config", "parsed_request"]

# row key -> (the request, the engine config its owner had at hand, or None)
_KEPT: OrderedDict[str, tuple[SemsoftRequest, Any]] = OrderedDict()
_LOCK = threading.Lock()


def keep(request: SemsoftRequest, vllm_config: Any = None) -> None:
    """Keep `request` (parsed, with its row key) for the later steps of this process,
    with the engine's `vllm_config` where its owner has it (the server's middleware)."""
    if request.row_key is None:
        return
    with _LOCK:
        _KEPT[request.row_key] = (request, vllm_config)
        _KEPT.move_to_end(request.row_key)
        while len(_KEPT) > CACHE_SIZE:
            _KEPT.popitem(last=False)


def forget(row_key: str | None) -> None:
    """Free the request kept under `row_key` (its owner's step is over)."""
    if row_key is not None:
        with _LOCK:
            _KEPT.pop(row_key, None)


def parsed_request(extra_args: Mapping[str, Any] | None) -> tuple[SemsoftRequest | None, bool]:
    """The request `extra_args` carries, and whether it was parsed here (then the
    caller owns it: it is kept, and the caller frees it with `forget`).

    In-process rules (`parse_request(server=False)`): an HTTP body is parsed by the
    server's middleware itself, with the server's limits, before it mints the key. A
    kept request is returned only for the very key its owner minted, and only while
    `extra_args` still carries its options as written (a copy edited under the same
    key is parsed afresh, never answered with the stale parse)."""
    key = extra_args.get(KEY_ROW_KEY) if isinstance(extra_args, Mapping) else None
    if isinstance(key, str):
        with _LOCK:
            found = _KEPT.get(key)
        if found is not None and _carries(found[0], extra_args or {}):
            return found[0], False
    request = parse_request(extra_args)
    if request is not None:
        keep(request)
    return request, request is not None and request.row_key is not None


def _carries(request: SemsoftRequest, extra_args: Mapping[str, Any]) -> bool:
    """Whether `extra_args` holds exactly the semsoft options `request` writes."""
    ours = {k: v for k, v in extra_args.items() if isinstance(k, str) and k.startswith("semsoft_")}
    return ours == request.to_extra_args()


def kept_config(extra_args: Mapping[str, Any] | None) -> Any:
    """The engine config kept with the request `extra_args` names by its row key, or
    None (not kept, or kept by an owner without one)."""
    key = extra_args.get(KEY_ROW_KEY) if isinstance(extra_args, Mapping) else None
    if not isinstance(key, str):
        return None
    with _LOCK:
        found = _KEPT.get(key)
    return None if found is None else found[1]
