"""Which of the spec and the flags sets a run's seed, horizon and request cap (WL-1.2 - WL-1.4),
and the guard that generation is bounded."""

from __future__ import annotations

from blis_fast.errors import BlisConfigError
from blis_fast.gonum import INT64_MAX


def resolve_workload_seed(spec_seed: int, cli_seed: int, cli_seed_given: bool) -> int:
    """WL-1.2: the spec's seed unless ``--seed`` was given explicitly."""
    return int(cli_seed) if cli_seed_given else int(spec_seed)


def resolve_horizon(spec_horizon: int, cli_horizon: int, cli_horizon_given: bool) -> int:
    """WL-1.3: a positive spec horizon replaces the default unless ``--horizon`` was given."""
    if spec_horizon > 0 and not cli_horizon_given:
        return int(spec_horizon)
    return int(cli_horizon)


def resolve_max_requests(spec_num_requests: int, cli_num_requests: int,
                         cli_num_requests_given: bool) -> int:
    """WL-1.4: the spec's ``num_requests`` unless ``--num-requests`` was given (even 0)."""
    return int(cli_num_requests) if cli_num_requests_given else int(spec_num_requests)


def check_generation_bounded(max_requests: int, horizon: int) -> None:
    """WL-1.4 guard: an uncapped request count needs a finite horizon."""
    if max_requests <= 0 and horizon == INT64_MAX:
        raise BlisConfigError(
            "Workload requires either num_requests or --horizon to bound generation"
        )
