"""Validate a corpus finding on a real rollout: the case's masks searched among batches the framework's own
batch code builds from a tiny LM's generations, the fault placed at one named boundary, the step's outputs
judged against the float64 reference.

    with open_rollout("roll@c09bc8bc9f43") as rollout:
        record = validate(entry, rollout)            # a JSON-ready dict; record["verdict"]["reproduced"]

The search (`search`): per seed, the LM samples a pool (every prompt of `lm.PROMPTS`, `POOL_SAMPLES` samples
each, at most N new tokens) and the framework builds its batch of the pool; each case row needs a pool row
whose mask classes (`T` trainable, `R` a masked real token, `P` padding) hold the case row's at one offset:
the same span from the first to the last trainable token, the same classes before and after it, the same
truncation (a response without EOS). The generation decides every response length and mask; the executed
batch is the chosen rows, each its own request, rebuilt by the framework's code. N is the case's longest
span plus the padding after it (the cut length, when the case has cut rows), so a response that stops at a
sampled EOS leaves that padding.

The executed step (`step_wide`): where the batch-code module declares `STEP_WIDE_PADDING = True` (SkyRL pads
every response to the longest response of the step it is given), a row's padding exists only inside its step:
the chosen row re-batched alone has none. There the whole pool is executed as the framework's step, the fault
is placed only on the chosen rows (every other row holds 0 at the boundary and scores 0), the function under
test runs on the whole step, and the verdict judges the chosen rows' valid-token outputs (`Scenario.step_rows`).
Elsewhere the chosen rows are executed as a batch of their own (each its own request), as before.

The fault (`fault_of`): the case's values, token rewards and score at the embedded positions, 0 at the
positions the case does not cover (extra prompt tokens, extra padding). Under the mask the case's values are
the poison; a case with none gets `POISON_PROBE` there, as the poison property probes. At lam = 1 a value leak
telescopes away, so the step runs at lam 0.5 (the poison property's probe). The clean twin is the same step
with 0 under the mask. Reproduced: a trainable position where the poisoned step leaves the float64 reference's
tolerance (`oracles.tolerance`) and the clean twin does not, i.e. the masked critic value moved it.

The outcome recipe (`OUTCOME`: score-kept, telescoping): the case's step as it is (its values verbatim, no probe, its
own lam), the twin the same step with score 0. Reproduced: a trainable position off the reference with the score
while the twin agrees with its own reference, i.e. the score does not arrive where the reference puts it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch

from maskfuzz.fuzz.corpus_codec import Entry, case_to_json, encode_float
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import POISON_PROBE
from maskfuzz.oracles.kinds.gae.properties import expected_outputs
from maskfuzz.oracles.kinds.gae.tolerance import bounds
from maskfuzz.oracles.tolerance import mismatches
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.requests import Batch, BatchRequest, Fault
from maskfuzz.targets.rollout.session import Rollout

POOL_SAMPLES = 16  # samples per prompt and seed: a pool of len(lm.PROMPTS) * 16 rows
MAX_SEEDS = 64
PROBE_LAM = 0.5  # the poison property's lam when the case's is 1 (oracles.kinds.gae.properties._check_poison)
SUPPORTED = ("poison",)  # properties with a recipe: critic values under the mask
# properties of the outcome score's recipe: the case's step as it is (its values verbatim, no probe), judged with
# the score and, as the twin, without it: a score the framework loses moves the reference and not the outputs
OUTCOME = ("score-kept", "telescoping")
# (property, triage mechanism) of other findings whose fault is the poison recipe's: a `reference` finding of a
# masked-value bootstrap is a masked critic value moving valid outputs, the same fault (its case holds the values);
# so is a `telescoping` one (at gamma = lam = 1 the masked values moved the valid outputs off the telescoped sum)
SAME_FAULT = (("reference", "masked-value-bootstrap"), ("telescoping", "masked-value-bootstrap"))
BUILT_SHOWN = 6  # the commonest row masks a failed search names as what the real path built instead


class CannotValidate(Exception):
    """The finding cannot be run on a real rollout (the message says why): exit 2."""


class NotBuilt(CannotValidate):
    """The real path ran and built no batch holding the case (the message says what it searched): a pipeline
    label it does not back, recorded as `built: false` (fuzz.evidence)."""


@dataclass(frozen=True)
class Scenario:
    """A batch the framework built from real generations that holds the case's masks.

    request           the LM request of the pool the rows come from
    generation        the executed step's generation: the chosen rows (`Generation.rows`: B = the case's rows,
                      K = 1), or the whole pool where the framework pads step-wide (`step_wide`)
    pool_rows[b]      the pool row behind case row b; offsets[b]: batch position = case position + offset
    step_rows[b]      the row of the executed step holding case row b (b itself, or pool_rows[b] step-wide)
    sequence_length   the pipeline's configured length, prompt width + N
    seeds_tried, pool_size  what the search cost
    """

    request: lm.RolloutRequest
    generation: lm.Generation
    pool_rows: tuple[int, ...]
    offsets: tuple[int, ...]
    sequence_length: int
    seeds_tried: int
    pool_size: int
    step_rows: tuple[int, ...]
    step_wide: bool

    def judged(self, rows: int) -> torch.Tensor:
        """[rows] bool: the executed step's rows the verdict judges (those holding the case's rows)."""
        mask = torch.zeros(rows, dtype=torch.bool)
        mask[list(self.step_rows)] = True
        return mask


def step_wide(rollout: Rollout) -> bool:
    """Whether the framework pads a row to the longest row of its step (the batch-code module's declaration
    `STEP_WIDE_PADDING`): then only the whole pool, executed as one step, holds a row's padding."""
    return bool(getattr(rollout.declaration(), "STEP_WIDE_PADDING", False))


def row_classes(attention: torch.Tensor, trainable: torch.Tensor) -> str:
    """One row's mask classes: `T` trainable, `R` a masked real token, `P` padding. [T] bool -> str of length T."""
    return "".join("T" if t else ("R" if a else "P") for a, t in zip(attention.tolist(), trainable.tolist()))


def embed(case_row: str, batch_row: str) -> int | None:
    """The offset at which `case_row`'s classes sit in `batch_row` with the same trainable span (from its first
    to its last `T`), or None. A row without `T` needs a batch row without one; it sits at the batch row's end
    (padding after the prompt) if it fits there, else at its start."""
    n, m = len(case_row), len(batch_row)
    if "T" not in case_row:
        if "T" in batch_row or n > m:
            return None
        for off in (m - n, 0):
            if batch_row[off : off + n] == case_row:
                return off
        return None
    first_c, first_b = case_row.index("T"), batch_row.find("T")
    if first_b < 0:
        return None
    off = first_b - first_c
    if off < 0 or off + n > m or batch_row[off : off + n] != case_row:
        return None
    if batch_row.rindex("T") != off + case_row.rindex("T"):
        return None  # the batch row has trainable tokens beyond the case's span
    return off


def new_tokens(case: Case) -> int:
    """N, the generation limit: a cut row's length when the case has cut rows (one limit: a framework knows a
    cut row by it), else the longest trainable span plus the padding after it."""
    cut = case.truncated_rows()
    rows = [row_classes(case.attention[b], case.trainable[b]) for b in range(case.shape[0])]
    if bool(cut.any()):
        spans = {r.rindex("T") - r.index("T") + 1 for r, c in zip(rows, cut.tolist()) if c and "T" in r}
        if len(spans) != 1:
            raise CannotValidate(f"cut rows of spans {sorted(spans)}: one generation limit cuts them all at one length")
        return spans.pop()
    need = [len(r) - r.index("T") for r in rows if "T" in r]
    return max(need) if need else max(1, case.shape[1])


def search(case: Case, rollout: Rollout, max_seeds: int = MAX_SEEDS, samples: int = POOL_SAMPLES) -> Scenario:
    """The first seed whose pool holds every case row (distinct pool rows, greedy in row order); raises
    NotBuilt after `max_seeds` seeds, naming the masks the real path built instead."""
    want = [row_classes(case.attention[b], case.trainable[b]) for b in range(case.shape[0])]
    cut = case.truncated_rows().tolist()
    n_new = new_tokens(case)
    wide = step_wide(rollout)
    pool_size = 0
    built: Counter[str] = Counter()
    for seed in range(max_seeds):
        request = lm.RolloutRequest(seed=seed, num_return_sequences=samples, max_new_tokens=n_new)
        (gen,) = rollout.lm(request)
        length = gen.prompt_length + n_new
        (pool,) = rollout.batch(BatchRequest(gen, length, dict(case.options)))
        pool_size = pool.attention.shape[0]
        have = [row_classes(pool.attention[r], pool.trainable[r]) for r in range(pool_size)]
        built.update(have)
        rows, offsets, used = [], [], set()
        for b, row in enumerate(want):
            hit = next(
                ((r, off) for r in range(pool_size) if r not in used and bool(pool.truncated[r]) == cut[b]
                 and (off := embed(row, have[r])) is not None),
                None,
            )  # fmt: skip
            if hit is None:
                break
            used.add(hit[0])
            rows.append(hit[0])
            offsets.append(hit[1])
        if len(rows) == len(want):
            step_rows = tuple(rows) if wide else tuple(range(len(rows)))
            return Scenario(request, gen if wide else gen.rows(rows), tuple(rows), tuple(offsets), length, seed + 1,
                            pool_size, step_rows, wide)  # fmt: skip
    shown = ", ".join(f"row {b}: {r}" for b, r in enumerate(want))
    instead = ", ".join(f"{m} x{n}" for m, n in built.most_common(BUILT_SHOWN))
    more = f" and {len(built) - BUILT_SHOWN} other mask(s)" if len(built) > BUILT_SHOWN else ""
    raise NotBuilt(
        f"the real path built no batch holding the case's masks ({shown}; T trainable, R masked real, P padding) "
        f"in {max_seeds} seeds x {pool_size} generated rows (max_new_tokens {n_new}); it built instead (rows over "
        f"those seeds): {instead}{more}"
    )


def fault_of(case: Case, scenario: Scenario, batch: Batch, lam: float, probe: bool = True) -> Fault:
    """The step's inputs at the hooked boundary, [B, T] float32 in the batch's canonical layout: the case's
    values / token rewards at the embedded positions of its rows (`Scenario.step_rows`; its poison under the
    mask, `POISON_PROBE` where it has none and `probe`), 0 elsewhere; the case's score on its rows, 0 on the
    step's others."""
    b_rows, t_len = batch.attention.shape
    values = torch.zeros(b_rows, t_len, dtype=torch.float64)
    rewards = torch.zeros(b_rows, t_len, dtype=torch.float64)
    score = torch.zeros(b_rows, dtype=torch.float64)
    dead = case.poison_mask()
    probe = probe and not bool((case.values[dead] != 0).any())
    case_values = torch.where(dead, torch.full_like(case.values, POISON_PROBE), case.values) if probe else case.values
    width = case.shape[1]
    for b, (row, off) in enumerate(zip(scenario.step_rows, scenario.offsets)):
        values[row, off : off + width] = case_values[b]
        rewards[row, off : off + width] = case.token_rewards[b]
        score[row] = case.score[b]
    return Fault(values.float(), rewards.float(), score.float(), gamma=case.gamma, lam=lam)


def executed_case(case: Case, batch: Batch, fault: Fault) -> Case:
    """The executed step as a canonical case (what the reference judges): the batch's masks, the fault's values,
    the token rewards that reached the framework (its reward path masks what lies under the response mask)."""
    reached = batch.reward_mask
    if reached is None and (roll_mask := batch.stages.get("response_mask")) is not None:
        reached = roll_mask[:, 1:]  # ROLL's layout: the sequence shifted by one
    rewards = fault.token_rewards.double()
    if reached is not None:
        rewards = rewards * reached.to(torch.float64)
    truncated = batch.truncated if bool(batch.truncated.any()) else None
    return Case.build(
        trainable=batch.trainable,
        attention=batch.attention,
        token_rewards=rewards,
        values=fault.values.double(),
        score=fault.score.double(),
        gamma=fault.gamma,
        lam=fault.lam,
        dtype=case.dtype,
        truncated=truncated,
        options=dict(case.options),
    )


def validate(entry: Entry, rollout: Rollout, declared: Declared, max_seeds: int = MAX_SEEDS) -> dict:
    """Run `entry` (its pipeline witness when it has one) on a real rollout; the validation record."""
    case = entry.witness or entry.case
    mechanism = (entry.triage or {}).get("mechanism")
    outcome = entry.property in OUTCOME
    if entry.property not in SUPPORTED + OUTCOME and (entry.property, mechanism) not in SAME_FAULT:
        raise CannotValidate(
            f"no real-rollout recipe for property {entry.property!r} (mechanism {mechanism!r}) yet "
            f"(covered: {SUPPORTED + OUTCOME}, and {', '.join('/'.join(p) for p in SAME_FAULT)})"
        )
    pipeline = declared.pipeline
    if pipeline is not None and (why := pipeline.rejects(case)):
        raise NotBuilt(f"the case lies outside what {rollout.ref.target}'s pipeline builds: {why}")
    if case.has_nonfinite_poison():
        raise CannotValidate("NaN / inf under the mask: the critic's values are finite in a real step")
    scenario = search(case, rollout, max_seeds)
    lam = PROBE_LAM if case.lam == 1.0 and declared.domain.critic and not outcome else case.lam
    options, length = dict(case.options), scenario.sequence_length
    (masks,) = rollout.batch(BatchRequest(scenario.generation, length, options))
    _check_embedded(case, scenario, masks)
    fault = fault_of(case, scenario, masks, lam, probe=not outcome)
    (poisoned,) = rollout.batch(BatchRequest(scenario.generation, length, options, fault))
    if outcome:  # the twin: the same step without the outcome score
        clean_fault = dataclasses.replace(fault, score=torch.zeros_like(fault.score))
    else:  # the twin: the same step with 0 under the mask (values and token rewards)
        live = poisoned.trainable
        clean_fault = dataclasses.replace(fault, values=torch.where(live, fault.values, torch.zeros_like(fault.values)),
                                          token_rewards=torch.where(live, fault.token_rewards,
                                                                    torch.zeros_like(fault.token_rewards)))  # fmt: skip
    (clean,) = rollout.batch(BatchRequest(scenario.generation, length, options, clean_fault))
    executed = executed_case(case, poisoned, fault)
    twin = executed_case(case, clean, clean_fault) if outcome else None
    return _record(entry, case, rollout, declared, scenario, poisoned, clean, executed, fault, twin)


def _check_embedded(case: Case, scenario: Scenario, batch: Batch) -> None:
    """The executed batch (the chosen rows, rebuilt as their own requests) still holds the case at the offsets."""
    for b, (row, off) in enumerate(zip(scenario.step_rows, scenario.offsets)):
        want = row_classes(case.attention[b], case.trainable[b])
        if embed(want, row_classes(batch.attention[row], batch.trainable[row])) != off:
            raise CannotValidate(f"row {row} of the executed batch no longer holds the case's masks at offset {off}")


def _expected(executed: Case, declared: Declared):
    """The float64 reference of `executed` (the whole step's: a whitening's statistics span it) and its bounds."""
    declared = declared.configured(executed)
    expected = expected_outputs(executed, declared)
    if expected is None:
        raise CannotValidate("the reference is undefined for the executed step (whitening over < 2 tokens)")
    ref_adv, ref_ret = expected
    return ref_adv, ref_ret, bounds(executed, declared.contract, ref_adv, ref_ret, declared.whitening)


def judge(
    executed: Case,
    declared: Declared,
    poisoned: Batch,
    clean: Batch,
    rows: torch.Tensor | None = None,
    twin: Case | None = None,
) -> dict:
    """Poisoned and clean outputs of the executed step against the float64 reference at the trainable positions
    of `rows` ([B] bool; None: every row); the clean twin against its own step's reference where that is another
    step (`twin`: the outcome recipe's, without the score).

    Answers `reference` (advantages, returns), `bounds`, `leak` [B, T] (off the reference poisoned, within it
    clean: the masked value moved it), `clean_off`, and the largest |poisoned - reference| / |poisoned - clean|
    over the judged positions."""
    ref_adv, ref_ret, bnd = _expected(executed, declared)
    twin_adv, twin_ret, twin_bnd = (ref_adv, ref_ret, bnd) if twin is None else _expected(twin, declared)
    live = executed.trainable if rows is None else executed.trainable & rows[:, None]
    off = {}
    for name, batch, (r_adv, r_ret, b) in (("poisoned", poisoned, (ref_adv, ref_ret, bnd)),
                                           ("clean", clean, (twin_adv, twin_ret, twin_bnd))):  # fmt: skip
        off[name] = mismatches(batch.advantages, r_adv, b.advantages, live) | mismatches(
            batch.returns, r_ret, b.returns, live
        )
    leak = off["poisoned"] & ~off["clean"]
    if twin is None:  # the poison promise itself: the masked inputs moved a valid output off the zeroed twin's,
        # also where the twin is off the reference for another defect (slime's lost score under its poison)
        leak = leak | mismatches(poisoned.advantages, clean.advantages.double(), bnd.advantages, live) | mismatches(
            poisoned.returns, clean.returns.double(), bnd.returns, live
        )
    delta = (poisoned.advantages.double() - ref_adv).abs() * live
    moved = (poisoned.advantages.double() - clean.advantages.double()).abs() * live
    # the returns too: where the advantages are whitened (verl) a leak shows mostly in the returns
    ret_delta = (poisoned.returns.double() - ref_ret).abs() * live
    return {
        "reference": (ref_adv, ref_ret),
        "bounds": bnd,
        "leak": leak,
        "clean_off": off["clean"],
        "max_abs_delta": float(delta.max()) if delta.numel() else 0.0,
        "max_abs_moved": float(moved.max()) if moved.numel() else 0.0,
        "max_abs_return_delta": float(ret_delta.max()) if ret_delta.numel() else 0.0,
    }


def _record(entry, case, rollout, declared, scenario, poisoned, clean, executed, fault, twin=None) -> dict:
    rows = scenario.judged(poisoned.attention.shape[0])
    judged = judge(executed, declared, poisoned, clean, rows, twin)
    ref_adv, ref_ret = judged["reference"]
    shown = list(scenario.step_rows)  # the judged rows, in the case's row order
    leak = judged["leak"]
    poison_at = (~executed.trainable) & (fault.values != 0)
    poison_values = sorted({float(v) for v in fault.values[poison_at].tolist()})
    reproduced = bool(leak.any())
    if twin is not None:
        line = _outcome_line(reproduced, fault, int(leak.sum()), judged)
    elif reproduced:
        line = (
            f"reproduced: the masked critic value(s) {poison_values}{_masked_rewards(executed, fault)} moved "
            f"{int(leak.sum())} valid-token output(s) "
            f"off the float64 reference (max |advantage - reference| {judged['max_abs_delta']:.6g}, "
            f"max |return - reference| {judged['max_abs_return_delta']:.6g}; moved against the same step with 0 "
            f"under the mask by up to {judged['max_abs_moved']:.6g})"
            + (f"; that twin is itself off the reference at {int(judged['clean_off'].sum())} valid-token output(s): "
               "another defect" if bool(judged["clean_off"].any()) else "")
        )
    elif bool(judged["clean_off"].any()):
        line = (
            f"not reproduced as a masked-input leak: the same step with 0 under the mask is off the float64 reference "
            f"too, at {int(judged['clean_off'].sum())} valid-token output(s) (another defect); the masked inputs moved "
            f"the advantages by at most {judged['max_abs_moved']:.6g}"
        )
    else:
        line = (
            "not reproduced: every valid-token advantage and return agrees with the float64 reference "
            f"(max |advantage - reference| {judged['max_abs_delta']:.3g}, max |return - reference| "
            f"{judged['max_abs_return_delta']:.3g}, within tolerance)"
        )
    return {
        "kind": "maskfuzz-validation",
        "version": 1,
        "entry": {
            "id": entry.id,
            "target": entry.key,
            "pin": entry.pin,
            "property": entry.property,
            "mechanism": (entry.triage or {}).get("mechanism"),
            "validated": "witness" if entry.witness else "case",
            "case": case_to_json(case),
        },
        "target": str(rollout.ref),
        "resolved": rollout.checkout.resolved,
        "contract": declared.contract,
        "recipe": _recipe(rollout, scenario, poisoned, fault, case, poison_at, poison_values),
        "batch": {name: x.tolist() for name, x in poisoned.stages.items() if name != "input_ids"},
        "observed": {"advantages": _rows(poisoned.advantages[shown]), "returns": _rows(poisoned.returns[shown])},
        "clean_twin": {"advantages": _rows(clean.advantages[shown]), "returns": _rows(clean.returns[shown])},
        "reference": {
            "advantages": _rows(ref_adv[shown]),
            "returns": _rows(ref_ret[shown]),
            "contract": declared.contract,
        },  # fmt: skip
        "positions": _positions(executed, poisoned, clean, judged, shown),
        "verdict": {
            "reproduced": reproduced,
            "line": line,
            "leaked_positions": leak.nonzero().tolist(),
            "max_abs_advantage_delta": judged["max_abs_delta"],
            "max_abs_moved_by_poison": judged["max_abs_moved"],
            "max_abs_return_delta": judged["max_abs_return_delta"],
            "clean_twin_off_reference": judged["clean_off"].nonzero().tolist(),
        },
        "metrics": poisoned.metrics,
    }


def _masked_rewards(executed: Case, fault: Fault) -> str:
    """` (with the masked token reward(s) [...])` where the case puts token rewards under the mask, else ""."""
    at = (~executed.trainable) & (fault.token_rewards != 0)
    values = sorted({float(v) for v in fault.token_rewards[at].tolist()})
    return f" (with the masked token reward(s) {values})" if values else ""


def _outcome_line(reproduced: bool, fault: Fault, n: int, judged: dict) -> str:
    """The verdict line of the outcome recipe (the step with its score, the twin without)."""
    deltas = (f"max |advantage - reference| {judged['max_abs_delta']:.6g}, max |return - reference| "
              f"{judged['max_abs_return_delta']:.6g}")  # fmt: skip
    if reproduced:
        return (f"reproduced: the outcome score {fault.score.tolist()} does not reach {n} valid-token output(s) as "
                f"the float64 reference has it ({deltas}); the same step without the score agrees with its "
                "reference")  # fmt: skip
    if bool(judged["clean_off"].any()):
        return f"not reproduced: the step is off its reference with and without the score alike ({deltas})"
    return f"not reproduced: with and without the score every valid-token output agrees with the reference ({deltas})"


def _recipe(rollout: Rollout, scenario: Scenario, batch: Batch, fault: Fault, case: Case, poison_at, values) -> dict:
    """Model config, preserved infrastructure (the upstream functions called), hooked boundary, scenario."""
    code = rollout.declaration()
    req, gen, shown = scenario.request, scenario.generation, list(scenario.step_rows)
    return {
        "validation_mode": "real_tiny_lm_rollout_plus_framework_batch_code_hook",
        "model": lm.describe(req),
        "preserved_infrastructure": [
            "transformers LlamaForCausalLM.generate (real sampling, EOS, padding)",
            *batch.called,
            *getattr(code, "INFRASTRUCTURE", ()),
        ],
        "hooked_boundary": code.HOOKED_BOUNDARY,
        "boundary_inputs": list(code.BOUNDARY_INPUTS),
        "replaced_component": code.REPLACED_COMPONENT,
        "stand_ins": rollout.info["batch"].get("stand_ins_used", []),
        "constructed_scenario": {
            "prompts": [gen.prompts[r // gen.num_return_sequences] for r in shown],
            "responses": [gen.responses[r] for r in shown],
            "seed": req.seed,
            "pool": {
                "prompts": len(req.conversations),
                "samples": req.num_return_sequences,
                "rows": scenario.pool_size,
                "rows_used": list(scenario.pool_rows),
            },
            "seeds_tried": scenario.seeds_tried,
            "max_new_tokens": req.max_new_tokens,
            "sequence_length": scenario.sequence_length,
            "step": {
                "rows": int(batch.attention.shape[0]),
                "whole_pool": scenario.step_wide,
                "judged_rows": shown,
                "why": (
                    "the framework pads every row to the step's longest (STEP_WIDE_PADDING): the whole pool runs "
                    "as its step, the fault only on the judged rows"
                    if scenario.step_wide
                    else "the chosen rows, each its own request, rebuilt as a batch of their own"
                ),
            },  # fmt: skip
            "offsets": list(scenario.offsets),
            "masks": [row_classes(batch.attention[b], batch.trainable[b]) for b in shown],
            "masked_critic_values": values,
            "poisoned_positions": poison_at.nonzero().tolist(),
            "score": fault.score[shown].tolist(),
            "gamma": fault.gamma,
            "lam": fault.lam,
            "case_lam": case.lam,
            "options": dict(case.options),
        },
    }


def _positions(executed: Case, poisoned: Batch, clean: Batch, judged: dict, rows: list[int]) -> list[dict]:
    """Every trainable position of the judged `rows` (`row`: its row in the executed step): its token, the observed
    (poisoned), clean-twin and reference outputs, the tolerance."""
    ref_adv, ref_ret = judged["reference"]
    bound = judged["bounds"].advantages
    f = lambda x: encode_float(float(x))  # noqa: E731
    return [
        {
            "row": b,
            "position": t,
            "token": lm.token_text(_token_at(poisoned, b, t)),
            "observed_advantage": f(poisoned.advantages[b, t]),
            "clean_twin_advantage": f(clean.advantages[b, t]),
            "reference_advantage": f(ref_adv[b, t]),
            "tolerance": f(bound[b, t]),
            "observed_return": f(poisoned.returns[b, t]),
            "reference_return": f(ref_ret[b, t]),
            "leaked": bool(judged["leak"][b, t]),
        }
        for b in rows
        for t in executed.trainable[b].nonzero().flatten().tolist()
    ]


def _rows(x: torch.Tensor) -> list:
    return [[encode_float(v) for v in row] for row in x.double().tolist()]


def _token_at(batch: Batch, b: int, t: int) -> int:
    """The token id at canonical position t of row b (`Batch.tokens`, else sequence token t + 1: ROLL's layout)."""
    if batch.tokens is not None:
        return int(batch.tokens[b, t])
    ids = batch.stages.get("input_ids")
    return int(ids[b, t + 1]) if ids is not None and t + 1 < ids.shape[1] else -1


def jsonable(x):
    """`x` with every non-finite float written as corpus numbers are ("nan", "inf", "-inf"); tensors as lists."""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, float):
        return encode_float(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def markdown(record: dict) -> str:
    """The validation record as a short report: recipe, scenario, observed (buggy) vs reference output, verdict."""
    recipe, scenario = record["recipe"], record["recipe"]["constructed_scenario"]
    step = scenario["step"]
    model = recipe["model"]
    cfg, tok, gen = model["config"], model["tokenizer"], model["generation"]
    entry = record["entry"]
    out = [
        f"# {entry['target']}/{entry['property']}-{entry['id']} on a real rollout",
        "",
        f"**{record['target']}** ({record['resolved']}): {record['verdict']['line']}.",
        "",
        "## Recipe",
        "",
        f"- model: {model['backend']}; {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']} heads, weights of seed {cfg['init_seed']}",
        f"- tokenizer: {tok['kind']}, {tok['vocab_size']} tokens, special "
        + ", ".join(f"`{v}`" for v in tok["special_tokens"].values()),
        f"- generation: sampling at temperature {gen['temperature']}, seed {gen['seed']}, "
        f"max_new_tokens {gen['max_new_tokens']}, {gen['num_return_sequences']} samples per prompt, "
        f"never {', '.join(f'`{t}`' for t in gen['suppress_tokens'])}",
        "- preserved infrastructure (called, in order): "
        + ", ".join(f"`{c}`" for c in recipe["preserved_infrastructure"]),
        f"- hooked boundary: {recipe['hooked_boundary']}",
        *[f"  - {line}" for line in recipe["boundary_inputs"]],
        f"- replaced component: {recipe['replaced_component'] or 'none'}; stand-ins (never called by the math): "
        + (", ".join(recipe["stand_ins"]) or "none"),
        "",
        "## Constructed scenario",
        "",
        f"The generation decided every response and mask; the search took seed {scenario['seed']} "
        f"({scenario['seeds_tried']} seed(s) tried, pools of {scenario['pool']['rows']} rows: "
        f"{scenario['pool']['prompts']} prompts x {scenario['pool']['samples']} samples). "
        f"sequence_length {scenario['sequence_length']}. Executed step: {step['rows']} row(s), {step['why']}.",
        "",
        "| row | prompt | response | masks (T trainable, R masked real, P padding) |",
        "|---|---|---|---|",
    ]
    rows = zip(step["judged_rows"], scenario["prompts"], scenario["responses"], scenario["masks"])
    for b, p, r, m in rows:
        out.append(f"| {b} | `{_cell(p)}` | `{_cell(r)}` | `{m}` |")
    lam = f"lam {scenario['lam']}" + (f" (the case's lam {scenario['case_lam']}: a value leak telescopes away at 1, "
                                      "so the poison property probes at 0.5)" if scenario["lam"] != scenario["case_lam"]
                                      else "")  # fmt: skip
    outcome = entry["property"] in OUTCOME  # the outcome recipe: with the score, the twin without it
    what, twin, moved = (("with the score", "twin without the score", "off the reference") if outcome
                         else ("the masked value in", "clean twin", "moved by the mask"))  # fmt: skip
    out += [
        "",
        f"Masked critic value(s) {scenario['masked_critic_values']} at [row, position] "
        f"{scenario['poisoned_positions']}; score {scenario['score']}; gamma {scenario['gamma']}, {lam}.",
        "",
        f"## Observed output ({what}) vs reference (contract `{record['contract']}`, float64)",
        "",
        f"| row | position | token | observed advantage | {twin} | reference | tolerance | observed return | "
        f"reference return | {moved} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in record["positions"]:
        out.append(
            f"| {p['row']} | {p['position']} | `{_cell(p['token'])}` | {p['observed_advantage']} | "
            f"{p['clean_twin_advantage']} | {p['reference_advantage']} | {float(p['tolerance']):.3g} | "
            f"{p['observed_return']} | {p['reference_return']} | {'yes' if p['leaked'] else 'no'} |"
        )
    out += ["", f"**{'Reproduced' if record['verdict']['reproduced'] else 'Not reproduced'}.**", ""]
    return "\n".join(out)


def _cell(text: str) -> str:
    """`text` inside a markdown table cell (a `|` ends the cell, even in code)."""
    return text.replace("|", "\\|")
