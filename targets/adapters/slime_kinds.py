"""slime entries beyond GAE (`shared/design/kinds.md`): group-advantage, kl, normalization, returns.

slime is miles' origin; the code and the way it is called are the same, at other homes (read at
HEAD 624b824a8), so the runners are miles' (`targets.adapters.miles_kinds`):

* `grpo`: `RolloutManager._post_process_rewards` (slime/ray/rollout.py:608-633, a method of a Ray
  actor class: compiled from the source text), then `get_grpo_returns` (slime/utils/ppo_utils.py:361)
  with the float32 zero KL of `kl_coef == 0` (slime/backends/megatron_utils/loss.py:746, 764-765).
* `kl`, `kl-k3`, `kl-low-var`: `compute_approx_kl` (slime/utils/ppo_utils.py:11-51), the eager
  function under `@torch.compile(dynamic=True)`.
* `whiten`: `distributed_masked_whiten` (slime/utils/distributed_utils.py:111-171) over a one-rank
  gloo group, as `--normalize-advantages` calls it (loss.py:871).
* `reinforce++`: `get_reinforce_plus_plus_returns` (slime/utils/ppo_utils.py:371-445), which asks
  `megatron.core.mpu` for the CP size inside the call: the single-rank state of the GAE adapter.
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import miles_kinds as mk
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from

KIND_ENTRIES = mk.KIND_ENTRIES
MATH_HOMES = ("slime.utils.ppo_utils",)
REWARD_HOMES = (("slime/ray/rollout.py", "RolloutManager"),)


def load(root: Path, entry: str) -> Loaded:
    from maskfuzz.targets.adapters.slime import install_mpu_state

    if entry not in KIND_ENTRIES:
        raise NotPresent(f"unknown entry {entry!r}")
    notes: list[str] = []
    if entry == "grpo":
        post, post_where, is_method = mk.reward_postprocess(root, ("slime",), REWARD_HOMES)
        ret, ret_where = mk.math_function(root, "get_grpo_returns", MATH_HOMES)
        types_mod = import_from(root, "slime.utils.types")
        notes += [
            f"{post_where} compiled from the source text (self = args + custom_reward_post_process_func None)",
            "rows ordered group by group (as the rollout's list of groups); n_samples_per_prompt = the largest "
            "group, rollout_batch_size = the number of groups; order restored after",
            "then the trainer: float32 rewards, float32 zero KL per response token (kl_coef 0), get_grpo_returns",
        ]
        run = mk.grpo_runner(post, is_method, ret, lambda r: mk.make_sample(types_mod, r))
        return Loaded(run, f"{post_where} + {ret_where}", notes)
    if entry == "whiten":
        fn, where = function_from(root, [("slime.utils.distributed_utils", "distributed_masked_whiten")])
        notes.append(mk.init_one_rank_gloo())
        notes.append("per-sample advantages and loss masks concatenated (loss.py normalize_advantages)")
        return Loaded(mk.whiten_runner(fn), where, notes)
    kl_fn, kl_where = mk.math_function(root, "compute_approx_kl", MATH_HOMES)
    kl_eager = mk.eager(kl_fn)
    if kl_eager is not kl_fn:
        notes.append("compute_approx_kl: the eager function under @torch.compile (_torchdynamo_orig_callable)")
    if entry in mk.KL_ENTRIES:
        notes.append(f"kl_loss_type={mk.KL_ENTRIES[entry]!r}")
        return Loaded(mk.kl_runner(kl_eager, mk.KL_ENTRIES[entry]), kl_where, notes)
    install_mpu_state()
    notes.append("state: megatron.core.mpu answers CP size 1, CP rank 0 (as slime's tests stub it)")
    fn, where = mk.math_function(root, "get_reinforce_plus_plus_returns", MATH_HOMES)
    notes.append("token rewards enter as KL: compute_approx_kl(0, token_rewards, 'k1'), kl_coef = 1")
    return Loaded(mk.reinforce_runner(fn, kl_eager), where, notes)
