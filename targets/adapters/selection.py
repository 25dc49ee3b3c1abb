"""What keeps a discovered variant from the invariants-only judge, read from its body: the one list of the ops
that do so, for the scanner (`targets.discovery`) and the worker-side calls alike (a reproducer copies this module)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

# ops after which permutation, pad-invariance and determinism are not promises of the code: a random draw
# (Clip-Cov's randperm), or a rank over the batch whose ties fall to position (KL-Cov's topk)
ORDER_OPS = ("randperm", "rand", "randn", "randint", "multinomial", "bernoulli", "normal", "topk", "kthvalue")
# calls after which a row's output depends on every other row of the batch by design: a whitening over the batch
# (verl's GDPO ends in `masked_whiten(advantages, response_mask)`): group-isolation is then not a promise
BATCH_OPS = ("masked_whiten",)


def selection_problem(fn, root: Path, batch: bool) -> str:
    """Why the invariants-only judge cannot take `fn` as it is ("" when it can): a random draw or a rank over the
    batch in its body (`ORDER_OPS`), or, for an estimator (`batch`), a whitening over the whole batch."""
    inner = inspect.unwrap(fn)
    file = Path(inspect.getsourcefile(inner)).resolve().relative_to(Path(root).resolve())
    lines, first = inspect.getsourcelines(inner)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    order, whole = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
        at = f"{file}:{first + node.lineno - 1}"
        if isinstance(node.func, ast.Attribute) and name in ORDER_OPS:
            order.append(f"torch.{name} at {at}")
        elif batch and name in BATCH_OPS:
            whole.append(f"{name} at {at}")
    if order:
        return (
            f"selects by a random draw or a rank over the batch ({', '.join(order)}): permutation, pad-invariance "
            "and determinism are not its promises, and the invariants-only judge has no seeded twin"
        )
    if whole:
        return (
            f"normalises over the whole batch ({', '.join(whole)}): group-isolation is not its promise, and the "
            "invariants-only judge cannot set it aside"
        )
    return ""
