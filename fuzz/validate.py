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

The fault (`fault_of`): the case's values, token rewards and score at the embedded positions, 0 at the
positions the case does not cover (extra prompt tokens, extra padding). Under the mask the case's values are
the poison; a case with none gets `POISON_PROBE` there, as the poison property probes. At lam = 1 a value leak
telescopes away, so the step runs at lam 0.5 (the poison property's probe). The clean twin is the same step
with 0 under the mask. Reproduced: a trainable position where the poisoned step leaves the float64 reference's
tolerance (`oracles.tolerance`) and the clean twin does not, i.e. the masked critic value moved it.
"""

from __future__ import annotations

import dataclasses
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
# (property, triage mechanism) of other findings whose fault is the poison recipe's: a `reference` finding of a
# masked-value bootstrap is a masked critic value moving valid outputs, the same fault (its case holds the values)
SAME_FAULT = (("reference", "masked-value-bootstrap"),)


class CannotValidate(Exception):
    """The finding cannot be run on a real rollout (the message says why): exit 2."""


class NotBuilt(CannotValidate):
    """The real path ran and built no batch holding the case (the message says what it searched): a pipeline
    label it does not back, recorded as `built: false` (fuzz.evidence)."""


@dataclass(frozen=True)
class Scenario:
    """A batch the framework built from real generations that holds the case's masks.

    request           the LM request of the pool the rows come from
    generation        the executed rows' generation (`Generation.rows`: B = the case's rows, K = 1)
    pool_rows[b]      the pool row behind case row b; offsets[b]: batch position = case position + offset
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
    CannotValidate after `max_seeds` seeds."""
    want = [row_classes(case.attention[b], case.trainable[b]) for b in range(case.shape[0])]
    cut = case.truncated_rows().tolist()
    n_new = new_tokens(case)
    pool_size = 0
    for seed in range(max_seeds):
        request = lm.RolloutRequest(seed=seed, num_return_sequences=samples, max_new_tokens=n_new)
        (gen,) = rollout.lm(request)
        length = gen.prompt_length + n_new
        (pool,) = rollout.batch(BatchRequest(gen, length, dict(case.options)))
        pool_size = pool.attention.shape[0]
        have = [row_classes(pool.attention[r], pool.trainable[r]) for r in range(pool_size)]
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
            return Scenario(request, gen.rows(rows), tuple(rows), tuple(offsets), length, seed + 1, pool_size)
    shown = ", ".join(f"row {b}: {r}" for b, r in enumerate(want))
    raise NotBuilt(
        f"the real path built no batch holding the case's masks ({shown}; T trainable, R masked real, P padding) "
        f"in {max_seeds} seeds x {pool_size} generated rows (max_new_tokens {n_new})"
    )


def fault_of(case: Case, scenario: Scenario, batch: Batch, lam: float) -> Fault:
    """The step's inputs at the hooked boundary, [B, T] float32 in the batch's canonical layout: the case's
    values / token rewards at the embedded positions (its poison under the mask, `POISON_PROBE` where it has
    none), 0 elsewhere; the case's score per row."""
    b_rows, t_len = batch.attention.shape
    values = torch.zeros(b_rows, t_len, dtype=torch.float64)
    rewards = torch.zeros(b_rows, t_len, dtype=torch.float64)
    dead = case.poison_mask()
    probe = not bool((case.values[dead] != 0).any())
    case_values = torch.where(dead, torch.full_like(case.values, POISON_PROBE), case.values) if probe else case.values
    width = case.shape[1]
    for b, off in enumerate(scenario.offsets):
        values[b, off : off + width] = case_values[b]
        rewards[b, off : off + width] = case.token_rewards[b]
    return Fault(values.float(), rewards.float(), case.score.float(), gamma=case.gamma, lam=lam)


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
    if entry.property not in SUPPORTED and (entry.property, mechanism) not in SAME_FAULT:
        raise CannotValidate(
            f"no real-rollout recipe for property {entry.property!r} (mechanism {mechanism!r}) yet "
            f"(covered: {SUPPORTED}, and {', '.join('/'.join(p) for p in SAME_FAULT)})"
        )
    pipeline = declared.pipeline
    if pipeline is not None and (why := pipeline.rejects(case)):
        raise NotBuilt(f"the case lies outside what {rollout.ref.target}'s pipeline builds: {why}")
    if case.has_nonfinite_poison():
        raise CannotValidate("NaN / inf under the mask: the critic's values are finite in a real step")
    scenario = search(case, rollout, max_seeds)
    lam = PROBE_LAM if case.lam == 1.0 and declared.domain.critic else case.lam
    options, length = dict(case.options), scenario.sequence_length
    (masks,) = rollout.batch(BatchRequest(scenario.generation, length, options))
    _check_embedded(case, scenario, masks)
    fault = fault_of(case, scenario, masks, lam)
    (poisoned,) = rollout.batch(BatchRequest(scenario.generation, length, options, fault))
    clean_values = torch.where(poisoned.trainable, fault.values, torch.zeros_like(fault.values))
    clean_fault = dataclasses.replace(fault, values=clean_values)
    (clean,) = rollout.batch(BatchRequest(scenario.generation, length, options, clean_fault))
    executed = executed_case(case, poisoned, fault)
    return _record(entry, case, rollout, declared, scenario, poisoned, clean, executed, fault)


def _check_embedded(case: Case, scenario: Scenario, batch: Batch) -> None:
    """The executed batch (the chosen rows, rebuilt as their own requests) still holds the case at the offsets."""
    for b, off in enumerate(scenario.offsets):
        want = row_classes(case.attention[b], case.trainable[b])
        if embed(want, row_classes(batch.attention[b], batch.trainable[b])) != off:
            raise CannotValidate(f"row {b} of the executed batch no longer holds the case's masks at offset {off}")


def _judge(executed: Case, declared: Declared, poisoned: Batch, clean: Batch) -> dict:
    """Poisoned and clean outputs against the float64 reference at trainable positions."""
    declared = declared.configured(executed)
    expected = expected_outputs(executed, declared)
    if expected is None:
        raise CannotValidate("the reference is undefined for the executed step (whitening over < 2 tokens)")
    ref_adv, ref_ret = expected
    bnd = bounds(executed, declared.contract, ref_adv, ref_ret, declared.whitening)
    live = executed.trainable
    off = {}
    for name, batch in (("poisoned", poisoned), ("clean", clean)):
        off[name] = mismatches(batch.advantages, ref_adv, bnd.advantages, live) | mismatches(
            batch.returns, ref_ret, bnd.returns, live
        )
    leak = off["poisoned"] & ~off["clean"]
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


def _record(entry, case, rollout, declared, scenario, poisoned, clean, executed, fault) -> dict:
    judged = _judge(executed, declared, poisoned, clean)
    ref_adv, ref_ret = judged["reference"]
    leak = judged["leak"]
    poison_at = (~executed.trainable) & (fault.values != 0)
    poison_values = sorted({float(v) for v in fault.values[poison_at].tolist()})
    reproduced = bool(leak.any())
    if reproduced:
        line = (
            f"reproduced: the masked critic value(s) {poison_values} moved {int(leak.sum())} valid-token output(s) "
            f"off the float64 reference (max |advantage - reference| {judged['max_abs_delta']:.6g}, "
            f"max |return - reference| {judged['max_abs_return_delta']:.6g})"
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
        "observed": {"advantages": _rows(poisoned.advantages), "returns": _rows(poisoned.returns)},
        "clean_twin": {"advantages": _rows(clean.advantages), "returns": _rows(clean.returns)},
        "reference": {"advantages": _rows(ref_adv), "returns": _rows(ref_ret), "contract": declared.contract},
        "positions": _positions(executed, poisoned, clean, judged),
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


def _recipe(rollout: Rollout, scenario: Scenario, batch: Batch, fault: Fault, case: Case, poison_at, values) -> dict:
    """Model config, preserved infrastructure (the upstream functions called), hooked boundary, scenario."""
    code = rollout.declaration()
    req = scenario.request
    return {
        "validation_mode": "real_tiny_lm_rollout_plus_framework_batch_code_hook",
        "model": lm.describe(req),
        "preserved_infrastructure": [
            "transformers LlamaForCausalLM.generate (real sampling, EOS, padding)",
            *batch.called,
            "tensordict.TensorDict",
        ],
        "hooked_boundary": code.HOOKED_BOUNDARY,
        "boundary_inputs": list(code.BOUNDARY_INPUTS),
        "replaced_component": code.REPLACED_COMPONENT,
        "stand_ins": rollout.info["batch"].get("stand_ins_used", []),
        "constructed_scenario": {
            "prompts": scenario.generation.prompts,
            "responses": scenario.generation.responses,
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
            "offsets": list(scenario.offsets),
            "masks": [row_classes(batch.attention[b], batch.trainable[b]) for b in range(batch.attention.shape[0])],
            "masked_critic_values": values,
            "poisoned_positions": poison_at.nonzero().tolist(),
            "score": fault.score.tolist(),
            "gamma": fault.gamma,
            "lam": fault.lam,
            "case_lam": case.lam,
            "options": dict(case.options),
        },
    }


def _positions(executed: Case, poisoned: Batch, clean: Batch, judged: dict) -> list[dict]:
    """Every trainable position: its token, the observed (poisoned), clean-twin and reference outputs, the tolerance."""
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
        for b, t in executed.trainable.nonzero().tolist()
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
        f"sequence_length {scenario['sequence_length']}.",
        "",
        "| row | prompt | response | masks (T trainable, R masked real, P padding) |",
        "|---|---|---|---|",
    ]
    for b, (p, r, m) in enumerate(zip(scenario["prompts"], scenario["responses"], scenario["masks"])):
        out.append(f"| {b} | `{_cell(p)}` | `{_cell(r)}` | `{m}` |")
    lam = f"lam {scenario['lam']}" + (f" (the case's lam {scenario['case_lam']}: a value leak telescopes away at 1, "
                                      "so the poison property probes at 0.5)" if scenario["lam"] != scenario["case_lam"]
                                      else "")  # fmt: skip
    out += [
        "",
        f"Masked critic value(s) {scenario['masked_critic_values']} at [row, position] "
        f"{scenario['poisoned_positions']}; score {scenario['score']}; gamma {scenario['gamma']}, {lam}.",
        "",
        f"## Observed output (the masked value in) vs reference (contract `{record['contract']}`, float64)",
        "",
        "| row | position | token | observed advantage | clean twin | reference | tolerance | observed return | "
        "reference return | moved by the mask |",
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
