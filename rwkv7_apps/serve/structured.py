"""Structured outputs and tool calling for the server: a request body's constraint
(scheduler/constraint.py) and its tool-call plan, checked before any decode work.

Where a constraint comes from (at most one per request):
- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``;
- vLLM's extensions: ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``
  (Lark) and their newer form ``structured_outputs: {json|regex|choice|grammar|json_object}``;
- tools (chat): ``tool_choice`` "required" or a named function constrains the answer to tool
  calls (JSON, see ``calls_schema``); "auto" leaves it free and reads a tool call out of it
  when the answer is one; "none" ignores the tools.

The model writes tool calls as JSON: ``{"name": ..., "arguments": {...}}``, a list of them
when ``parallel_tool_calls`` (the default) allows several. The tools are listed to the model
in a system turn (chat.py renders it), and earlier calls and tool results are turns too.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from scheduler.constraint import Constraint
from scheduler.grammar import grammars_for
from rwkv7_core.engine import Capability

from .protocol import APIError

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools: ``tools`` {name: parameters schema}; ``forced``: the answer
    must be tool calls (required or a named function); ``parallel``: several calls allowed."""
    tools: dict[str, dict]
    descriptions: dict[str, str]
    forced: str | None      # None (auto), "required", or the named function
    parallel: bool

    def calls_schema(self) -> dict:
        """JSON schema of the answer when tool calls are forced."""
        names = [self.forced] if self.forced != "required" else list(self.tools)
        one = [{"type": "object", "properties": {"name": {"const": n}, "arguments": self.tools[n]},
                "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        call = one[0] if len(one) == 1 else {"anyOf": one}
        return {"type": "array", "items": call, "minItems": 1} if self.parallel else call

    def system_text(self) -> str:
        """The system turn that lists the tools to the model."""
        listed = [{"name": n, "description": self.descriptions[n], "parameters": p} for n, p in self.tools.items()]
        shape = ('a JSON list of {"name": ..., "arguments": {...}} objects' if self.parallel
                 else 'one JSON object {"name": ..., "arguments": {...}}')
        return ("You can call these functions: " + json.dumps(listed)
                + f". To call functions, answer with only {shape}.")


def _one(body) -> list[tuple[str, Constraint]]:
    """(field, constraint) of every structured-output field the body sets."""
    found = []
    if body.response_format is not None:
        try:
            constraint = Constraint.from_response_format(body.response_format)
        except ValueError as e:
            raise APIError(400, f"response_format: {e}", "response_format") from None
        if constraint is not None:
            found.append(("response_format", constraint))
    for name, kind in GUIDED.items():
        value = getattr(body, name)
        if value is not None:
            found.append((name, _constraint(name, kind, value)))
    so = body.structured_outputs
    if so is not None:
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) is not None]
        unknown = sorted(set(so) - {"json", "regex", "choice", "grammar", "json_object"})
        if unknown or len(given) != 1:
            raise APIError(400, "structured_outputs: give exactly one of json, regex, choice, grammar, json_object"
                           + (f" (unknown: {', '.join(unknown)})" if unknown else ""), "structured_outputs")
        found.append(("structured_outputs", _constraint("structured_outputs", given[0], so[given[0]])))
    return found


def _constraint(field: str, kind: str, value) -> Constraint:
    try:
        if kind == "json":
            return Constraint.json_schema(value)
        if kind == "json_object":
            return Constraint.json_object()
        if kind == "choice":
            return Constraint.choice(value)
        if not isinstance(value, str) or not value:
            raise ValueError(f"a {kind} must be a non-empty string")
        return Constraint.regex(value) if kind == "regex" else Constraint.grammar(value)
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", field) from None


def tool_plan(body) -> ToolPlan | None:
    """The tools of a chat body (None: no tools, or tool_choice "none"); 400 naming the problem."""
    tools, choice = getattr(body, "tools", None), getattr(body, "tool_choice", None)
    if not tools:
        if choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice: no tools given", "tool_choice")
        return None
    params, descriptions = {}, {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(function, dict):
            raise APIError(400, f"tools[{i}]: only {{\"type\": \"function\", \"function\": {{...}}}} tools are served",
                           "tools")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"tools[{i}].function.name: every tool needs a name", "tools")
        if name in params:
            raise APIError(400, f"tools[{i}].function.name: {name!r} appears twice", "tools")
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise APIError(400, f"tools[{i}].function.parameters: must be a JSON schema object", "tools")
        params[name], descriptions[name] = schema, str(function.get("description", ""))
    if choice in (None, "auto"):
        forced = None
    elif choice == "none":
        return None
    elif choice == "required":
        forced = "required"
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        forced = choice["function"].get("name")
        if forced not in params:
            raise APIError(400, f"tool_choice: no tool named {forced!r}", "tool_choice")
    else:
        raise APIError(400, f"tool_choice: {choice!r} is not auto, none, required or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    parallel = getattr(body, "parallel_tool_calls", None) is not False and forced in (None, "required")
    return ToolPlan(params, descriptions, forced, parallel)


def request_constraint(ctx, body, plan: ToolPlan | None) -> Constraint | None:
    """The body's one constraint (compiled now: 400 naming an invalid schema or grammar, or an
    unsupported feature, before any decode work); None for free text."""
    found = _one(body)
    if plan is not None and plan.forced is not None:
        found.append(("tool_choice", Constraint.json_schema(plan.calls_schema())))
    if not found:
        return None
    if len(found) > 1:
        raise APIError(400, f"{found[1][0]}: only one structured-output field per request "
                            f"(also given: {found[0][0]})", found[1][0])
    field, constraint = found[0]
    engine = ctx.service.scheduler.engine
    if ctx.tokenizer is None or Capability.TOKEN_MASK not in engine.capabilities:
        raise APIError(400, f"{field}: structured output needs the World vocabulary and an engine with token "
                            "masks", field)
    try:
        grammars_for(ctx.tokenizer, ctx.vocab_size).compiled(constraint)
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", field) from None
    return constraint


def tool_calls(text: str, plan: ToolPlan) -> list[dict] | None:
    """The OpenAI ``tool_calls`` an answer stands for (None when it is not a tool call: free
    text under "auto", or JSON that names no tool)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    calls = value if isinstance(value, list) else [value]
    if not calls or not all(isinstance(c, dict) and c.get("name") in plan.tools and isinstance(c.get("arguments"), dict)
                            for c in calls):
        return None
    return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in calls]


def history_text(message) -> str:
    """A chat message's text for the prompt: an assistant's tool calls as the JSON it would
    have written, a tool result as its content."""
    if message.role == "assistant" and message.tool_calls:
        calls = []
        for call in message.tool_calls:
            function = call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                arguments = function.get("arguments")
            calls.append({"name": function.get("name"), "arguments": arguments})
        return json.dumps(calls if len(calls) > 1 else calls[0])
    return message.text()
