"""Which filed calls the operator's catalogue admits (the intake, docs/design.md "The
intake"): a pure rule the gateway asks before it sends a filing (so bad input is
answered at once and nothing is sent or stored) and the ledger asks again (a program
may file over the bus too). No I/O, no clock, no randomness.

Policy is the operator's, never the caller's: the origin a filing names must be
declared and admit the program; the tool must be one the origin may file, or the
origin must declare a default for tools the catalogue does not know; the arguments
must fit the tool's schema. Then the tool's own rule decides whether a person must
approve, as for a call of Signoff's own model.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.catalogue import ToolCatalogue, ToolSpec, declared_tool_name
from shared.messages import FileCall, filed_session_id


@dataclass(frozen=True)
class Refused:
    """A filing the catalogue does not admit: a machine-readable code and a text that
    names what is wrong, never an argument's value."""

    reason_code: str
    reason_text: str


@dataclass(frozen=True)
class Admitted:
    """A filing the catalogue admits: the tool as recorded (`<origin>/<tool>` for one
    the caller declared) and its spec."""

    tool: str
    spec: ToolSpec
    declared_by_caller: bool


def judge_filing(catalogue: ToolCatalogue, command: FileCall) -> Admitted | Refused:
    """Whether the catalogue admits this filing. Every refusal names what is wrong and
    never an argument's value."""
    if command.session_id != filed_session_id(command.program, command.caller_call_id):
        return Refused("wrong_session", "A filed call's session is `filed_session_id(program, caller_call_id)`.")
    origin = catalogue.origins.get(command.origin)
    if origin is None:
        return Refused("unknown_origin", f"The catalogue declares no origin {command.origin!r}.")
    if command.program not in origin.programs:
        return Refused(
            "origin_not_allowed", f"{command.program!r} may not file calls for the origin {command.origin!r}."
        )
    spec = catalogue.get(command.tool)
    declared = False
    if spec is not None and command.tool not in origin.tools:
        return Refused(
            "tool_not_declared_for_origin",
            f"The origin {command.origin!r} may not file calls of {command.tool!r}: "
            "the catalogue does not list it for that origin.",
        )
    if spec is None:
        spec = catalogue.declared_by_caller(command.origin, command.tool)
        declared = True
    if spec is None:
        return Refused(
            "unknown_tool",
            f"There is no tool named {command.tool!r}, and the origin {command.origin!r} declares no default "
            "for tools the catalogue does not know.",
        )
    if spec.runs == "signoff" and spec.implementation is None:
        return Refused("no_implementation", f"The tool {command.tool!r} has no implementation.")
    unexpected, errors = spec.argument_problems(command.arguments)
    if unexpected:
        return Refused(
            "unexpected_arguments",
            f"The tool {command.tool!r} takes no argument named " + ", ".join(map(repr, unexpected)) + ".",
        )
    if errors:
        return Refused("invalid_arguments", f"Invalid arguments for {command.tool!r}: " + "; ".join(errors))
    recorded = declared_tool_name(command.origin, command.tool) if declared else command.tool
    return Admitted(recorded, spec, declared)
