"""MD020 xla-temp-buffers: XLA's compiled program needs more memory than fits."""

from __future__ import annotations

from memdoc.kinds import OomKind
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure, said, specific_library
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    ratio_text,
    snippet,
)
from memdoc.units import format_bytes

# A request this many times all the data the program held was made inside the program.
FAR_LARGER = 8.0
# XLA's memory analysis of a compiled call (`argument`, `output`, `alias`, `temp`, in bytes).
_ANALYSED = frozenset({"argument", "output", "alias", "temp"})
# Donation decides when the outputs that could reuse undonated arguments are at least this
# share of what the plan holds at once (a jitted Adam step holding old and new parameters
# and moments: half); temporaries decide at this share.
UNDONATED_SHARE = 0.25
TEMP_SHARE = 0.5
_TO_CONFIRM = "print `jax.jit(f).lower(...).compile().memory_analysis()`"


def made_inside_the_program(facts: Facts, fail: Failure) -> bool:
    """An XLA request far larger than all the data the program held: the compiled program
    made it (a temporary), so a smaller batch or rematerialisation shrinks it."""
    oom = fail.oom
    requested = oom.requested_bytes
    if oom.framework != "jax" or not requested or not said(fail).xla_out_of_memory:
        return False
    if fail.jitted_call == "":
        return False  # no jitted function of the program ran: one eager operation made it
    held = facts.data_held
    return held is not None and requested >= FAR_LARGER * held.held_bytes


DONATE = Fix(
    "jax",
    "Donate the buffers the step overwrites",
    snippet(
        """
    import jax

    train_step = jax.jit(train_step, donate_argnums=(0,))  # state is updated in place
    """
    ),
)


class XlaTempBuffers(RuleSpec):
    slug = "xla-temp-buffers"
    code = "MD020"
    title = "XLA's compiled program needs more memory than fits"
    what = """
XLA compiles a whole jitted function into one program and plans all of its buffers in
advance: parameters, outputs and temporaries. When the plan's peak exceeds the device, the
first call fails with `RESOURCE_EXHAUSTED` and a buffer-assignment report listing the
largest buffers.
"""
    why = """
Inside one compiled program every intermediate of the forward and backward pass can be live
at once, unless it is rematerialized. Undonated inputs keep both the old and the new version
of large state (parameters, optimizer state) alive during the update. Large batches and long
sequences scale the temporaries.
"""
    confirm = """
- The error includes "BufferAssignment OOM Debugging", or "HLO temp" on TPU, or XLA warns
  that it "Can't reduce memory use below ... by rematerialization".
- It fails at the first call of a jitted function (compile time), not after many steps.
- The failed request is far larger than all the arrays the program holds.
- `jax.jit(f).lower(*args).compile().memory_analysis()` shows the temp size; `memdoc run`
  records it for the jitted call that failed: arguments and outputs held at once with
  nothing written into donated arguments (`alias` 0) is an undonated step.
"""
    fixes = (
        Fix(
            "jax",
            "Rematerialize activations in backward",
            snippet(
                """
            import jax

            block_apply = jax.checkpoint(block_apply)
            """
            ),
        ),
        DONATE,
        Fix(
            "jax",
            "Inspect the compiled program's memory before running it",
            snippet(
                """
            compiled = jax.jit(step).lower(state, batch).compile()
            print(compiled.memory_analysis())
            """
            ),
        ),
        Fix("any", "Smaller batch per device", "batch_size = batch_size // 2"),
    )
    references = (
        (
            "JAX: jax.checkpoint",
            "https://jax.readthedocs.io/en/latest/_autosummary/jax.checkpoint.html",
        ),
        ("JAX: buffer donation", "https://jax.readthedocs.io/en/latest/faq.html#buffer-donation"),
        (
            "JAX: GPU memory allocation",
            "https://jax.readthedocs.io/en/latest/gpu_memory_allocation.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return None
        oom = fail.oom
        involved = facts.frameworks(oom)
        if (
            oom.xla_temp_bytes
            or oom.xla_buffers
            or oom.kind == OomKind.COMPILE
            or said(fail).xla_buffer_plan
        ):
            return self._planned(facts, fail, involved)
        if fail.jitted_call == "":
            return None  # an eager operation's result, not a compiled program's working set
        analysed = (
            self._analysed(facts, fail, involved) if fail.compiled.keys() >= _ANALYSED else None
        )
        if analysed is not None:
            return analysed
        if (
            oom.framework == "jax"
            and specific_library(oom) is None
            and said(fail).xla_out_of_memory
        ):
            return self._unplanned(facts, fail, involved)
        return None

    def _unplanned(self, facts: Facts, fail: Failure, involved: list[str]) -> Finding:
        """No buffer plan in the text: weigh the request against the data the program held."""
        requested = fail.oom.requested_bytes
        evidence = [bytes_evidence("requested", requested)] if requested else []
        held = facts.data_held if requested else None
        if held is None or not requested:
            summary = "XLA could not allocate a buffer for the compiled program."
            return self.finding(
                facts,
                Signals(WEAK),
                summary,
                evidence,
                to_confirm=_TO_CONFIRM,
                frameworks=involved,
            )
        ratio = requested / held.held_bytes
        evidence += [
            bytes_evidence(held.label, held.held_bytes),
            ratio_evidence(f"request / {held.label}", ratio),
        ]
        if ratio >= FAR_LARGER:
            summary = (
                f"XLA asked for {format_bytes(requested)}, {ratio_text(ratio)} all the data the "
                "program held: a buffer its compiled program makes from small inputs, such as "
                "a temporary."
            )
            return self.finding(facts, Signals(LIKELY), summary, evidence, frameworks=involved)
        summary = (
            f"XLA could not allocate {format_bytes(requested)}, in proportion to the data the "
            "program held: as likely an ordinary result array as a temporary of the program."
        )
        return self.finding(
            facts, Signals(WEAK), summary, evidence, to_confirm=_TO_CONFIRM, frameworks=involved
        )

    def _analysed(self, facts: Facts, fail: Failure, involved: list[str]) -> Finding | None:
        """XLA's own memory analysis of the compiled call that failed: what its plan holds
        at once, and whether donating the arguments it replaces or its temporaries decide."""
        plan = fail.compiled
        arguments, outputs, alias, temp = (plan[k] for k in ("argument", "output", "alias", "temp"))
        needed = arguments + outputs - alias + temp
        if needed <= 0:
            return None
        name = f"`{fail.jitted_call}`" if fail.jitted_call else "the jitted call"
        short = facts.shortfall_at_failure(fail)
        # Outputs that could have been written into the arguments they replace, were those
        # donated: at most the smaller of the two, less what already was.
        donatable = max(min(arguments, outputs) - alias, 0)
        evidence = [
            bytes_evidence("arguments of the compiled program", arguments),
            bytes_evidence("outputs", outputs),
            bytes_evidence("outputs written into donated arguments", alias),
            bytes_evidence("temporaries", temp),
        ]
        if fail.oom.requested_bytes:
            evidence.append(bytes_evidence("requested", fail.oom.requested_bytes))
        if short is not None:
            evidence.append(bytes_evidence("short of the request", short))
        undonated = donatable >= UNDONATED_SHARE * needed and (short is None or donatable >= short)
        if undonated:
            summary = (
                f"The compiled {name} holds its {format_bytes(arguments)} of arguments and its "
                f"{format_bytes(outputs)} of outputs at once"
                + (" (none written into donated arguments)" if not alias else "")
                + f", {format_bytes(needed)} in all. Donating the arguments it replaces would "
                f"free up to {format_bytes(donatable)}"
                + (f"; the request was {format_bytes(short)} short." if short else ".")
            )
            signals = Signals.of(
                STRONG if short is not None else LIKELY, donation_would_make_room=short is not None
            )
            return self.finding(
                facts,
                signals,
                summary,
                evidence,
                frameworks=involved or ["jax"],
                fixes=_DONATE_FIRST,
            )
        if temp >= TEMP_SHARE * needed:
            summary = (
                f"The compiled {name} needs {format_bytes(temp)} of temporaries, "
                f"{temp / needed:.0%} of the {format_bytes(needed)} its plan holds at once."
            )
            return self.finding(
                facts, Signals(LIKELY), summary, evidence, frameworks=involved or ["jax"]
            )
        return None  # the plan is its arguments and outputs, donated where they could be:
        # weighed below as any request is

    def _planned(self, facts: Facts, fail: Failure, involved: list[str]) -> Finding:
        oom = fail.oom
        evidence: list[Evidence] = []
        for label, value in (
            ("all buffers of the program", oom.xla_total_bytes),
            ("parameters", oom.xla_parameter_bytes),
            ("outputs", oom.xla_output_bytes),
        ):
            if value is not None:
                evidence.append(bytes_evidence(label, value))
        if oom.xla_temp_bytes:
            evidence.append(bytes_evidence("temporary buffers of the program", oom.xla_temp_bytes))
        for description, size in oom.xla_buffers[:3]:
            evidence.append(bytes_evidence(f"large buffer {description}", size))
        if oom.requested_bytes:
            evidence.append(bytes_evidence("requested", oom.requested_bytes))
        if oom.source:
            evidence.append(Evidence(f"largest buffer made at: {oom.source}"))
        temp_dominates = bool(
            oom.xla_temp_bytes
            and oom.requested_bytes
            and oom.xla_temp_bytes >= 0.5 * oom.requested_bytes
        )
        summary = "XLA planned the program's buffers and the plan does not fit"
        if oom.xla_temp_bytes:
            summary += f": {format_bytes(oom.xla_temp_bytes)} of temporaries"
        summary += "."
        # Possible, not likely: in real threads the plan's excess was settled by a smaller
        # batch, a chunked shape or a larger device more often than by remat or donation.
        signals = Signals.of(
            POSSIBLE, temporaries_dominate=temp_dominates, buffers_listed=bool(oom.xla_buffers)
        )
        return self.finding(facts, signals, summary, evidence, frameworks=involved or ["jax"])


RULE = XlaTempBuffers()
# An undonated step's fixes: donation first, then the others in the catalogue's order.
_DONATE_FIRST = (DONATE, *(fix for fix in RULE.fixes if fix is not DONATE))
