"""Hypothesis strategies: valid TEIR configurations (as flat dicts) and broken ones."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

ROLES = {"C": (1, 1, 1), "M": (1, 0, 1), "N": (0, 1, 1), "K": (1, 1, 0)}
SCHEDULE_VECTORS = (
    "dim_types",
    "exec_types",
    "dim_sizes",
    "strides_in0",
    "strides_in1",
    "strides_out",
)


@st.composite
def layout_strides(
    draw: Any, sizes: list[int], members: list[int], dense: bool, allow_broadcast: bool
) -> list[int]:
    """Strides for one tensor: its axes in a random memory order, dense or padded.

    With ``dense=False`` strides are small random numbers (aliasing possible); with
    ``allow_broadcast`` an input may get stride 0 on an axis it takes part in.
    """
    strides = [0] * len(sizes)
    if not dense:
        for a in members:
            strides[a] = draw(st.integers(0, 6))
        return strides
    order = draw(st.permutations(members))
    step = 1
    for a in reversed(order):  # last in `order` is innermost
        if allow_broadcast and sizes[a] > 1 and draw(st.integers(0, 9)) == 0:
            continue
        strides[a] = step
        step = step * sizes[a] + draw(st.sampled_from([0, 0, 0, 1, 3]))
    return strides


@st.composite
def configs(draw: Any, max_dims: int = 6, max_size: int = 7, aliasing: bool = False) -> dict:
    """A valid configuration as a flat dict (1..max_dims axes, sizes 1..max_size).

    With ``aliasing=True`` the output strides are arbitrary small numbers, so output elements
    and tiles may alias; otherwise every tensor gets a (possibly padded) permuted dense layout.
    """
    data_type = draw(st.sampled_from(["FP32", "FP64"]))
    main = draw(st.sampled_from(["None", "Copy", "GEMM", "BRGEMM", "ReLU"]))
    first = draw(st.sampled_from(["None", "Zero", "ReLU"]))
    last = draw(st.sampled_from(["None", "ReLU"]))
    unary = main in ("Copy", "ReLU")
    if main == "GEMM":
        prim_types = ["M", "N", "K"]
    elif main == "BRGEMM":
        prim_types = ["M", "N", "K", "K"]
    elif unary:
        prim_types = draw(st.lists(st.sampled_from("CM"), min_size=1, max_size=3))
    else:
        needs_tile = first != "None" or last != "None"
        prim_types = draw(st.lists(st.sampled_from("CMNK"), min_size=int(needs_tile), max_size=3))
        if needs_tile and all(t == "K" for t in prim_types):
            prim_types.append(draw(st.sampled_from("CMN")))
    loop_count = draw(st.integers(0 if prim_types else 1, max_dims - len(prim_types)))
    loop_types = draw(
        st.lists(
            st.sampled_from("CM" if unary else "CMNK"), min_size=loop_count, max_size=loop_count
        )
    )
    loop_execs = draw(
        st.lists(st.sampled_from(["seq", "shared"]), min_size=loop_count, max_size=loop_count)
    )
    axes = [(t, "prim") for t in prim_types] + list(zip(loop_types, loop_execs))
    axes = draw(st.permutations(axes))
    assume(1 <= len(axes) <= max_dims)
    sizes = [draw(st.integers(1, max_size)) for _ in axes]
    cfg: dict[str, Any] = {
        "data_type": draw(st.sampled_from([data_type, data_type.lower()])),
        "prim_first": first,
        "prim_main": main,
        "prim_last": last,
        "dim_types": [t for t, _ in axes],
        "exec_types": [e for _, e in axes],
        "dim_sizes": sizes,
    }
    for tensor, name in enumerate(("strides_in0", "strides_in1", "strides_out")):
        members = [a for a, (t, _) in enumerate(axes) if ROLES[t][tensor]]
        is_out = tensor == 2
        cfg[name] = draw(
            layout_strides(
                sizes, members, dense=not (aliasing and is_out), allow_broadcast=not is_out
            )
        )
    return cfg


MUTATIONS = (
    "missing",
    "type",
    "enum",
    "length",
    "size>=1",
    "stride>=0",
    "stride-zero",
    "R1",
    "R2",
    "R3",
    "unary",
    "D>=1",
    "int64",
)


@st.composite
def broken_configs(draw: Any) -> tuple[dict, str]:
    """A configuration with one rule broken, and the identifier of that rule."""
    cfg = copy.deepcopy(draw(configs()))
    rule = draw(st.sampled_from(MUTATIONS))
    d = len(cfg["dim_types"])
    axis = draw(st.integers(0, d - 1))
    if rule == "missing":
        del cfg[draw(st.sampled_from(["data_type", "prim_main", *SCHEDULE_VECTORS]))]
    elif rule == "type":
        field = draw(st.sampled_from(SCHEDULE_VECTORS))
        cfg[field] = draw(st.sampled_from([None, 3, 2.5, "abc", {"a": 1}]))
    elif rule == "enum":
        field = draw(
            st.sampled_from(
                ["data_type", "prim_first", "prim_main", "prim_last", "dim_types", "exec_types"]
            )
        )
        bad = draw(st.sampled_from(["FP16", "X", "gemv", "", "par"]))
        if field in ("dim_types", "exec_types"):
            cfg[field][axis] = bad
        else:
            cfg[field] = bad
    elif rule == "length":
        field = draw(st.sampled_from(SCHEDULE_VECTORS[1:]))
        if draw(st.booleans()):
            cfg[field] = cfg[field][:-1]
        else:
            cfg[field] = [*cfg[field], cfg[field][-1]]
    elif rule == "size>=1":
        cfg["dim_sizes"][axis] = draw(st.sampled_from([0, -1, -7, 2.0, "3", None, True]))
    elif rule == "stride>=0":
        field = draw(st.sampled_from(SCHEDULE_VECTORS[3:]))
        cfg[field][axis] = draw(st.sampled_from([-1, -100, 1.5, "1", None, [1]]))
    elif rule == "stride-zero":
        choices = [
            (a, t) for a in range(d) for t in range(3) if not ROLES[cfg["dim_types"][a].upper()][t]
        ]
        assume(choices)
        a, t = draw(st.sampled_from(choices))
        cfg[("strides_in0", "strides_in1", "strides_out")[t]][a] = draw(st.integers(1, 50))
    elif rule == "R1":
        cfg["prim_last"] = "ReLU"
        cfg["exec_types"] = [
            "prim" if t == "K" and e == "prim" else "seq"
            for t, e in zip(cfg["dim_types"], cfg["exec_types"])
        ]
    elif rule in ("R2", "R3"):
        cfg["prim_main"] = "GEMM" if rule == "R2" else "BRGEMM"
        cfg["prim_first"] = "None"
        cfg["prim_last"] = "None"
        counts = _prim_counts(cfg)
        wanted = {"C": 0, "M": 1, "N": 1, "K": 1 if rule == "R2" else 2}
        if counts == wanted:  # break it by flipping one axis
            cfg["exec_types"][axis] = "seq" if cfg["exec_types"][axis] == "prim" else "prim"
        assume(_prim_counts(cfg) != wanted)
    elif rule == "unary":
        cfg["prim_main"] = draw(st.sampled_from(["Copy", "ReLU", "copy", "relu"]))
        cfg["dim_types"][axis] = draw(st.sampled_from(["N", "K"]))
    elif rule == "D>=1":
        for field in SCHEDULE_VECTORS:
            cfg[field] = []
    elif rule == "int64":
        cfg["dim_sizes"][axis] = 2**63 + draw(st.integers(0, 10))
    return cfg, rule


def _prim_counts(cfg: dict) -> dict[str, int]:
    counts = {"C": 0, "M": 0, "N": 0, "K": 0}
    for t, e in zip(cfg["dim_types"], cfg["exec_types"]):
        if e == "prim":
            counts[t] += 1
    return counts


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=7) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
