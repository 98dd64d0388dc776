"""``python -m training KIND --config FILE``: run one training job on its own, outside a sweep.

The config file (YAML or JSON) holds the fields of ``training.jobs.JobConfig`` (``name``,
``base``, ``teacher``, ``dataset``, ``split``, ``samples``, ``local_path``, ``epochs``, ``seed``)
and the kind-specific ``settings``. The job writes into ``--output-dir`` (default
``<jobs root>/<name>``); running the same command again after a crash resumes from the last
checkpoint, and after success prints the recorded result without training. Exit code 2 for a
bad config, 1 if the job failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from training.jobs import JOB_KINDS, JobConfig, JobConfigError, jobs_root, run_job
from workers.accelerator_probe import name_cpu_accelerator_when_no_cuda

EXIT_USER_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Run one SpecSweep training job (KD draft, SpecDec++ head, EESD early-exit "
        "draft, Cali-TS predictor); resumable from its last checkpoint.",
        epilog="example: python -m training distillspec --config kd.yaml\n"
        "config keys: name, base, teacher, dataset, split, samples, local_path, epochs, seed, "
        "settings",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=sorted(JOB_KINDS), help="the job to run")
    parser.add_argument("--config", required=True, type=Path, help="YAML or JSON job config")
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where the artifact and checkpoints go (default: <jobs root>/<name>; the jobs "
        "root is $SPECSWEEP_JOBS_DIR or <cache>/jobs)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def load_job_config(kind: str, path: Path) -> JobConfig:
    """Return the job config in file ``path`` for job ``kind``; JobConfigError names problems."""
    try:
        values: Any = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise JobConfigError(f"{path}: cannot read the config ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise JobConfigError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(values, dict):
        raise JobConfigError(f"{path}: the config must be a mapping of job fields")
    if values.setdefault("kind", kind) != kind:
        raise JobConfigError(f"{path}: kind {values['kind']!r} differs from the command's {kind!r}")
    values.setdefault("name", kind)
    try:
        return JobConfig.from_mapping(values)
    except JobConfigError as exc:
        raise JobConfigError(f"{path}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job the arguments name; return the process exit code."""
    args = _parser().parse_args(argv)
    try:
        config = load_job_config(args.kind, args.config)
        output_dir = args.output_dir or jobs_root() / config.name
        result = run_job(config, output_dir, progress=not args.no_progress)
    except JobConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    resumed = f" (resumed from step {result.resumed_from_step})" if result.resumed_from_step else ""
    print(f"{config.kind} job {config.name!r} done in {result.seconds:.1f} s{resumed}")
    print(f"artifact ({result.artifact_kind}): {result.artifact_path}")
    print(json.dumps(result.metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    name_cpu_accelerator_when_no_cuda()
    raise SystemExit(main())
