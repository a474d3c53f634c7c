"""Seeded fuzzing of SelectInfer GGUFs: mutate a valid file (metadata values, arrays, tensor infos,
header bytes, truncation), then load and run each mutant in a child process. A clean exception and
a run are the allowed outcomes; a signal or a hang is a failure. Used by tests/test_fuzz.py (a few
hundred cases) and scripts/fuzz_si_gguf.py (as many as asked)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from helpers import gguf_fields, gguf_tensors, make_si_model, write_gguf

from selectinfer.runtime.si_format import key as si_key

KINDS = ["value", "remove", "array", "tensor_shape", "tensor_type", "tensor_drop", "bytes", "truncate",
         "upstream_value"]

# values that break assumptions: zero, negative, huge, non-finite, wrong types
INTS = [0, 1, -1, 2, 3, 31, 32, 63, 64, 191, 192, 193, 255, 256, 257, 4096, 2**31 - 1, -2**31, 2**32 - 1, 2**40]
FLOATS = [0.0, -0.0, 1e-9, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, -0.5, 1e30, float("nan"), float("inf"), float("-inf")]
INT_TYPES = [V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64]
LIMITS = {V.UINT8: (0, 255), V.INT8: (-128, 127), V.UINT16: (0, 65535), V.INT16: (-32768, 32767),
          V.UINT32: (0, 2**32 - 1), V.INT32: (-2**31, 2**31 - 1), V.UINT64: (0, 2**64 - 1), V.INT64: (-2**63, 2**63 - 1)}


def _int_value(rng: random.Random, vtype: V) -> int:
    lo, hi = LIMITS[vtype]
    v = rng.choice(INTS) if rng.random() < 0.8 else rng.randint(lo, hi)
    return min(hi, max(lo, v))


def _random_value(rng: random.Random) -> tuple:
    kind = rng.choice(["int", "float", "bool", "str", "array_int", "array_float", "array_str"])
    if kind == "int":
        t = rng.choice(INT_TYPES)
        return t, _int_value(rng, t), None
    if kind == "float":
        return rng.choice([V.FLOAT32, V.FLOAT64]), rng.choice(FLOATS), None
    if kind == "bool":
        return V.BOOL, rng.random() < 0.5, None
    if kind == "str":
        return V.STRING, rng.choice(["", "1", "nan", "llama", "x" * 300, "-7"]), None
    n = rng.choice([0, 1, 2, 3, 30, 192, 256, 1000])
    if kind == "array_int":
        t = rng.choice(INT_TYPES)
        return V.ARRAY, [_int_value(rng, t) for _ in range(n)], t
    if kind == "array_float":
        return V.ARRAY, [rng.choice(FLOATS) for _ in range(n)], V.FLOAT32
    return V.ARRAY, ["a"] * n, V.STRING


def _edit_array(rng: random.Random, values: list, item: V) -> list:
    values = list(values)
    op = rng.choice(["set", "drop", "dup", "append", "shuffle", "empty"])
    if op == "set" and values:
        values[rng.randrange(len(values))] = _int_value(rng, item) if item in LIMITS else rng.choice(FLOATS)
    elif op == "drop" and values:
        del values[rng.randrange(len(values))]
    elif op == "dup" and values:
        values.insert(rng.randrange(len(values)), rng.choice(values))
    elif op == "append":
        values.append(_int_value(rng, item) if item in LIMITS else rng.choice(FLOATS))
    elif op == "shuffle":
        rng.shuffle(values)
    else:
        values = []
    return values


# the keys a mutation aims at: ours first, and the architecture keys they must agree with
def _target_keys(fields: dict) -> list[str]:
    ours = [k for k in fields if k.startswith("selectinfer.")]
    arch = [k for k in fields if k.startswith("llama.")]
    return ours * 3 + arch


def upstream_checked_keys(arch: str = "llama") -> list[str]:
    """The keys of the values llama.cpp would assert on, which the engine checks before it reads
    them (cpp/llama/file_checks.cpp, _native.FILE_CHECKS)."""
    from selectinfer import _native

    keys = []
    for check in _native.FILE_CHECKS:
        keys += [k.replace("{arch}", arch) for k in check["keys"].split() if "." in k]
    return keys


def _upstream_value(rng: random.Random, key: str, fields: dict) -> tuple:
    """An edge value for a key llama.cpp asserts on: zero, negative, huge, NaN or infinity, a
    per-layer array, the wrong type, or (for a string) an unknown name."""
    vtype = fields[key][0] if key in fields else None
    if vtype in (V.FLOAT32, V.FLOAT64):
        return (vtype, rng.choice(FLOATS), None)
    if vtype == V.STRING or rng.random() < 0.1:
        return (V.STRING, rng.choice(["", "bogus", "yarn", "none", "bert", "t5"]), None)
    if rng.random() < 0.15:
        return (V.ARRAY, [rng.choice(INTS[:12]) for _ in range(rng.choice([1, 2, 3]))], V.UINT32)
    if rng.random() < 0.1:
        return (V.BOOL, rng.random() < 0.5, None)
    t = rng.choice([V.UINT32, V.INT32, V.UINT64, V.INT64])
    lo, hi = LIMITS[t]
    return (t, min(hi, max(lo, rng.choice(INTS))), None)


@dataclass
class Base:
    """A valid GGUF and its parts, the starting point of every mutant: a SelectInfer file, or the
    plain file it was converted from."""
    path: Path
    fields: dict
    tensors: list
    data: bytes
    header_bytes: int

    @classmethod
    def of(cls, path: Path) -> "Base":
        from selectinfer import _native

        header = _native.read_gguf_header(str(path))
        return cls(path, gguf_fields(path), gguf_tensors(path), path.read_bytes(), int(header["data_offset"]))

    @classmethod
    def make(cls, root: Path) -> "Base":
        return cls.make_both(root)[0]

    @classmethod
    def make_both(cls, root: Path) -> tuple["Base", "Base"]:
        """(the SelectInfer base, the plain base)."""
        plain, random_ranked = make_si_model(root, seed=13, layers="1:3", n_ff=256)

        # with neuron shares, as a profile-ranked file holds them, so that mutants reach their checks
        fields = gguf_fields(random_ranked)
        for il in fields[si_key("layers")][1]:
            n_load = len(fields[si_key("neuron_ids", il)][1])
            shares = [0.8 / n_load * (2 - r / n_load) / 1.5 for r in range(n_load)]
            fields[si_key("neuron_shares", il)] = (V.ARRAY, shares, V.FLOAT32)
            # and gate statistics, as a file from a profile with input moments (compensation)
            fields[si_key("gate_rms", il)] = (V.ARRAY, [1.0 + r % 7 / 7 for r in range(n_load)], V.FLOAT32)
            fields[si_key("up_slope", il)] = (V.ARRAY, [0.5 - r % 5 / 5 for r in range(n_load)], V.FLOAT32)
        si = write_gguf(root / "si-shares.gguf", fields, gguf_tensors(random_ranked))
        return cls.of(si), cls.of(plain)


def mutant(base: Base, rng: random.Random, kind: str, out: Path) -> Path | None:
    """Writes one mutant of `kind` to `out`; None when the writer itself refuses the mutation."""
    if kind in ("bytes", "truncate"):
        data = bytearray(base.data)
        if kind == "truncate":
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.choice([1, 2, 4, 8, 32])):
                data[rng.randrange(base.header_bytes)] = rng.randrange(256)
        out.write_bytes(bytes(data))
        return out
    fields, tensors = dict(base.fields), [dict(t) for t in base.tensors]
    if kind == "upstream_value":
        key = rng.choice(upstream_checked_keys())
        fields[key] = _upstream_value(rng, key, fields)
    elif kind == "value":
        fields[rng.choice(_target_keys(fields))] = _random_value(rng)
    elif kind == "remove":
        fields.pop(rng.choice(_target_keys(fields)))
    elif kind == "array":
        arrays = [k for k, (vt, _, _) in fields.items() if vt == V.ARRAY and k != "tokenizer.ggml.tokens"
                  and (k.startswith("selectinfer.") or k.startswith("llama."))]
        # a plain file: the tokenizer's scores and token types
        arrays = arrays or [k for k, (vt, _, _) in fields.items() if vt == V.ARRAY and k != "tokenizer.ggml.tokens"]
        key = rng.choice(arrays)
        vt, values, item = fields[key]
        fields[key] = (vt, _edit_array(rng, values, item), item)
    else:
        ffn = [i for i, t in enumerate(tensors) if ".ffn_" in t["name"]]
        i = rng.choice(ffn if rng.random() < 0.8 else range(len(tensors)))
        if kind == "tensor_drop":
            del tensors[i]
        elif kind == "tensor_type":
            tensors[i]["type"] = rng.choice([Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q6_K, Q.I32, Q.IQ4_NL])
        else:
            ne = list(tensors[i]["ne"])
            d = rng.randrange(len(ne))
            ne[d] = max(1, rng.choice([ne[d] - 1, ne[d] + 1, ne[d] * 2, ne[d] // 2, 1, 32]))
            if rng.random() < 0.2:
                ne = list(reversed(ne))
            tensors[i]["ne"] = ne
    try:
        return write_gguf(out, fields, tensors)
    except Exception:  # gguf-py refuses some combinations (e.g. a shape its dtype cannot hold)
        return None


# The child: load each file, generate a few tokens (a prompt that selects, then sparse decode
# steps) in one of the modes, print one line per case. Any Python exception is a clean refusal.
MODES = [{}, {"dense": True}, {"layer_budgets": "profile"}, {"strategy": "gate-guided"}, {"coreinfer": True}]
WORKER = r"""
import sys
from selectinfer import Model
MODES = __MODES__
for i, line in enumerate(sys.stdin):
    path = line.strip()
    try:
        with Model(path, n_ctx=64, n_threads=2, **MODES[i % len(MODES)]) as m:
            m.generate("the capital of", max_tokens=3, temperature=0)
        print("ran", flush=True)
    except Exception as e:
        print("refused", type(e).__name__, str(e).replace("\n", " ")[:300], flush=True)
""".replace("__MODES__", repr(MODES))


@dataclass
class Report:
    outcomes: Counter = field(default_factory=Counter)   # ran / refused / unwritable per kind
    crashes: list = field(default_factory=list)          # (kind, file, what)
    messages: Counter = field(default_factory=Counter)   # exception types


def run_cases(n_cases: int, seed: int, workdir: Path, timeout_s: float = 60.0, keep: Path | None = None,
              progress: bool = False) -> Report:
    """Generates n_cases mutants from `seed` and runs them; crashing files are copied to `keep`."""
    si_base, plain_base = Base.make_both(workdir)
    rng = random.Random(seed)
    report = Report()
    cases = []
    for i in range(n_cases):
        kind = KINDS[i % len(KINDS)]
        # every third round of kinds on the plain file (its mutants exercise llama.cpp's own load)
        base = plain_base if (i // len(KINDS)) % 3 == 2 else si_base
        path = mutant(base, rng, kind, workdir / f"case-{i:05d}.gguf")
        if path is None:
            report.outcomes[(kind, "unwritable")] += 1
        else:
            cases.append((kind, path))
    pending = list(cases)
    while pending:
        pending = _run_worker(pending, report, timeout_s, keep, progress)
    return report


def _run_worker(cases: list, report: Report, timeout_s: float, keep: Path | None, progress: bool) -> list:
    """Runs cases in one child until it dies or hangs; returns the cases left after the culprit."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            env={**os.environ, "PYTHONFAULTHANDLER": "1", "GGML_NO_BACKTRACE": "1"})
    try:
        for n, (kind, path) in enumerate(cases):
            proc.stdin.write(f"{path}\n")
            proc.stdin.flush()
            line = _read_line(proc, timeout_s)
            if line is None:  # died or hung on this case
                hung = proc.poll() is None
                if hung:
                    proc.kill()
                proc.wait()
                what = "hang" if hung else f"signal {signal.Signals(-proc.returncode).name}" \
                    if proc.returncode < 0 else f"exit {proc.returncode}"
                stderr = proc.stderr.read()[-1500:]
                report.crashes.append((kind, str(_keep(path, keep)), f"{what}: {stderr}"))
                report.outcomes[(kind, "CRASH")] += 1
                return cases[n + 1:]
            outcome = line.split()[0]
            report.outcomes[(kind, outcome)] += 1
            if outcome == "refused":
                report.messages[line.split()[1]] += 1
            if progress and (sum(report.outcomes.values()) % 100 == 0):
                print(f"{sum(report.outcomes.values())} cases, {len(report.crashes)} crashes", file=sys.stderr)
            path.unlink(missing_ok=True)
        return []
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sel.select(timeout=max(0.0, deadline - time.monotonic())):
            line = proc.stdout.readline()
            return line if line else None
    return None


def _keep(path: Path, keep: Path | None) -> Path:
    if keep is None:
        return path
    keep.mkdir(parents=True, exist_ok=True)
    dest = keep / path.name
    dest.write_bytes(path.read_bytes())
    return dest


def summary(report: Report) -> str:
    kinds = sorted({k for k, _ in report.outcomes})
    lines = ["| mutation | ran | refused | not writable | crashed or hung |", "|---|---:|---:|---:|---:|"]
    for k in kinds:
        o = {outcome: n for (kind, outcome), n in report.outcomes.items() if kind == k}
        lines.append(f"| {k} | {o.get('ran', 0)} | {o.get('refused', 0)} | {o.get('unwritable', 0)} | {o.get('CRASH', 0)} |")
    total = Counter()
    for (_, outcome), n in report.outcomes.items():
        total[outcome] += n
    lines.append(f"| all | {total['ran']} | {total['refused']} | {total['unwritable']} | {total['CRASH']} |")
    return "\n".join(lines)

