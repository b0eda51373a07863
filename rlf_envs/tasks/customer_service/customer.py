"""A scripted customer: the default user simulator of ``RLF/CustomerService-v0`` (no model needed).

:func:`scripted_customer` answers the agent's last message from the scenario's facts, by keyword:
asked for an email it gives the email, asked which order it names the order, asked for a reason
or a new address it gives them, asked to confirm it says yes, and once the agent reports the
request done (or refused) it thanks and stops. A message it does not understand gets the next
fact it has not told yet, and after :data:`MAX_REPLIES` replies it stops. It is stateless: what
it already said is read off the chat. Use an LLM simulator for realistic users (docs/dialogue.md).

Example:
    >>> from rlf_envs.dialogue import UserTurnRequest
    >>> from rlf_envs.types import TaskInstance
    >>> facts = {"email": "ann@example.com", "order_id": "#W1001", "kind": "cancel"}
    >>> instance = TaskInstance("cs0", "Hi, cancel my order.", metadata={"facts": facts})
    >>> chat = [{"role": "user", "content": "Hi, cancel my order."},
    ...         {"role": "assistant", "content": "Sure. What is your email address?"}]
    >>> scripted_customer(UserTurnRequest(instance, "", chat, turn=0))
    'My email is ann@example.com.'
"""

from __future__ import annotations

import re
from typing import Any

from rlf_envs.dialogue.flags import DEFAULT_STOP_MARKER
from rlf_envs.dialogue.simulator import UserTurnRequest

__all__ = ["MAX_REPLIES", "scripted_customer"]

MAX_REPLIES = 6
DONE_WORDS = ("has been", "have been", "is now", "was successfully", "successfully", "the total",
              "cannot be cancelled", "can't be cancelled", "can not be cancelled", "unable to cancel",
              "not possible", "i'm sorry", "i am sorry", "done")  # fmt: skip
CONFIRM_WORDS = ("confirm", "proceed", "shall i", "should i", "do you want", "would you like", "go ahead", "is that correct")  # fmt: skip
_WORDS = re.compile(r"[a-z]+")
THANKS = f"Thank you, that is all I needed. {DEFAULT_STOP_MARKER}"


def _lines(facts: dict[str, Any]) -> dict[str, str]:
    lines = {"email": f"My email is {facts['email']}.", "order_id": f"It is order {facts['order_id']}."}
    if facts.get("reason"):
        lines["reason"] = f"The reason is: {facts['reason']}."
    if facts.get("address"):
        lines["address"] = f"The new address is {facts['address']}."
    return lines


def _asked(text: str, lines: dict[str, str]) -> str | None:
    """The fact the agent's message asks for, by keyword (None: no question it recognises)."""
    words = set(_WORDS.findall(text))
    if "email" in words:
        return "email"
    if words & {"reason", "why"}:
        return "reason" if "reason" in lines else None
    if "address" in words and "new" in words and "address" in lines:
        return "address"
    if words & {"order", "orders"} and words & {"which", "number", "id"}:
        return "order_id"
    return None


def scripted_customer(request: UserTurnRequest) -> str:
    """The customer's next message (see the module docs); the facts are ``instance.metadata["facts"]``."""
    facts = dict(request.instance.metadata.get("facts") or {})
    lines = _lines(facts)
    said = [m.get("content") or "" for m in request.messages if m.get("role") == "user"]
    agent = next(
        (m.get("content") or "" for m in reversed(request.messages) if m.get("role") == "assistant"), ""
    )
    text = " ".join(agent.lower().split())
    if request.turn >= 1 and (request.turn >= MAX_REPLIES or any(w in text for w in DONE_WORDS)):
        return THANKS
    key = _asked(text, lines)
    if key is not None:
        return lines[key]
    if any(w in text for w in CONFIRM_WORDS) and all(line in said for line in lines.values()):
        return "Yes, please go ahead."
    untold = [line for line in lines.values() if line not in said]
    if untold:
        return untold[0]
    return "Yes, please go ahead." if request.turn < MAX_REPLIES - 1 else THANKS
