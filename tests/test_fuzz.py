"""Fuzzing: a few hundred seeded mutants of a SelectInfer GGUF and of its plain source, each loaded
and run in a child process in one of the modes (default, dense, per-layer budgets, gate-guided,
CoreInfer); every outcome is a clean exception or a run, never a signal or a hang
(scripts/fuzz_si_gguf.py runs as many as asked)."""
from fuzzing import run_cases, summary

N_CASES = 360  # 40 of each mutation kind, a third of them on the plain file


def test_mutated_selectinfer_ggufs_never_crash(tmp_path):
    report = run_cases(N_CASES, seed=20261130, workdir=tmp_path, keep=tmp_path / "crashes")
    print(summary(report))
    assert not report.crashes, "\n".join(f"{kind}: {path}: {what}" for kind, path, what in report.crashes)
    refused = sum(n for (_, outcome), n in report.outcomes.items() if outcome == "refused")
    ran = sum(n for (_, outcome), n in report.outcomes.items() if outcome == "ran")
    # the mutations must reach the checks: most mutants are refused, and some still run
    assert refused > N_CASES // 2 and ran > 0, summary(report)
