"""The text rules behind :func:`rlf_envs.dialogue.flags.check_reply`, one function per failure shape.

Each rule takes the reply (and what it needs of the context) and returns a short reason when the
reply has that shape, else None. They are heuristics for English chat, written against the shapes
user simulators actually produce (see ``rlf_envs/dialogue/data/sim_replies.jsonl`` and
``rlf-bench simulator-checks`` for how often they fire on bad and on ordinary customer lines).

Example:
    >>> agent_voice("sure! i can help you with that.")
    "service line: 'i can help you'"
    >>> agent_voice("thanks, can you help me with my order?") is None
    True
    >>> role_labels("User: hi\\nAgent: hello, how can I help?")
    'a dialogue with 2 role-labelled lines'
"""

from __future__ import annotations

import json
import re

__all__ = [
    "agent_voice",
    "leaked_run",
    "normalized_words",
    "parroted",
    "prompt_talk",
    "role_labels",
    "self_identification",
    "special_tokens",
    "stop_marker_misuse",
    "tool_call_json",
]

# ------------------------------------------------------------------ template tokens, tool calls

_SPECIAL = re.compile(
    r"<\|[a-z0-9_.:-]{1,40}\|>"  # ChatML, Llama 3, Phi, gpt-oss: <|im_start|>, <|eot_id|>, <|end|> ...
    r"|<｜[^｜]{1,40}｜>"  # DeepSeek's full-width bars
    r"|\[/?(?:inst|sys|tool_calls|available_tools|tool_results)\]|<</?sys>>"  # Llama 2, Mistral
    r"|</?(?:start_of_turn|end_of_turn|bos|eos|s|pad|unk|eot|tools|function_calls|invoke)>"  # Gemma, HF
    r"|</?(?:tool_call|tool_response|answer|think|functioncall)>|<function=|<parameter="  # agent markup
    r"|^\s*#{2,4}\s*(?:instruction|response|human|assistant|user|system|input)\s*:?\s*$",  # Alpaca
    re.I | re.M,
)


def _first_match(patterns: list[re.Pattern[str]], text: str) -> str | None:
    """The text of the first pattern that matches ``text``, or None."""
    for pattern in patterns:
        found = pattern.search(text)
        if found is not None:
            return found.group()
    return None


def special_tokens(raw: str) -> str | None:
    """Another chat template's special token or the agent's markup inside the reply."""
    found = _SPECIAL.search(raw)
    return None if found is None else f"reply holds {found.group().strip()!r}"


_TOOL_KEYS = re.compile(r'"(?:name|function|tool|tool_name|action|recipient_name)"\s*:\s*"')
_ARG_KEYS = re.compile(r'"(?:arguments|parameters|args|action_input|tool_input|input|kwargs)"\s*:')
_CALL_KEYS = re.compile(r'"(?:tool_calls|function_call|tool_use)"\s*:')
_REACT = re.compile(r"^\s*action input\s*:|^\s*action\s*:\s*[a-z_.]+\s*$", re.I | re.M)
_PY_CALL = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\s*\(\s*(?:[a-z_]+\s*=|[\"'{]|\))")


def tool_call_json(raw: str) -> str | None:
    """A tool call written as JSON (``{"name": ..., "arguments": ...}``) or as ``fn(arg=...)``."""
    if _CALL_KEYS.search(raw) or (_TOOL_KEYS.search(raw) and _ARG_KEYS.search(raw)):
        return "reply holds a tool call as JSON"
    text = raw.strip().strip("`").removeprefix("json").strip()
    if text.startswith("{") and text.endswith("}"):
        try:
            if isinstance(json.loads(text), dict):
                return "reply is a JSON object"
        except ValueError:
            pass
    if _REACT.search(raw):
        return "reply holds a ReAct-style action"
    call = _PY_CALL.search(raw)
    return None if call is None else f"reply holds a function call {call.group()!r}"


# ------------------------------------------------------------------ role labels, dialogue

_ROLES = (
    r"user|customer|human|client|caller|shopper|buyer|me|you|agent|assistant|ai|bot|chatbot|model|gpt"
    r"|system|support|support agent|customer service|customer support|service agent|representative"
    r"|rep|operator|clerk|seller|shop|store|simulator|sim|user simulator"
)
_LABEL = (
    rf"(?:[-*>#]+\s*)?(?:\*\*|__)?\[?(?:{_ROLES})(?:\s*\d+)?\]?(?:\*\*|__)?\s*(?:\([^)]{{0,30}}\))?\s*[:：]"
)
_LABEL_AT_START = re.compile(rf"^\s*(?:{_LABEL}|<(?:{_ROLES})>)", re.I)
_LABEL_IN_TEXT = re.compile(rf"(?:^|\n|[.!?\"]\s+)\s*(?:{_LABEL}|<(?:{_ROLES})>)", re.I)
_ROLE_JSON = re.compile(r'"role"\s*:\s*"(?:user|assistant|system|agent|customer)"', re.I)
_NAME_LABEL = re.compile(r"^\s*\**([A-Z][a-z]+(?: [A-Z][a-z]+)?)\**\s*:\s+\S", re.M)
_NOT_SPEAKERS = {"Note", "Email", "Address", "Order", "Reason", "Name", "Subject", "Re", "Ps", "Update",
                 "Edit", "Zip", "Phone", "Item", "Items", "Total", "Date", "Time", "Status"}  # fmt: skip


def role_labels(body: str) -> str | None:
    """A reply that starts with a speaker label, or holds a whole dialogue with role prefixes."""
    if _ROLE_JSON.search(body):
        return "a chat transcript as JSON"
    labels = _LABEL_IN_TEXT.findall(body)
    if len(labels) >= 2:
        return f"a dialogue with {len(labels)} role-labelled lines"
    if _LABEL_AT_START.match(body):
        return "starts with a role label"
    speakers = [n for n in _NAME_LABEL.findall(body) if n.split()[0] not in _NOT_SPEAKERS]
    if len(speakers) >= 2 and len(set(speakers)) >= 2:
        return f"a dialogue between {sorted(set(speakers))}"
    return None


# ------------------------------------------------------------------ the agent's voice


def _compile(*patterns: str) -> list[re.Pattern[str]]:
    return [re.compile(p) for p in patterns]


# lines no customer writes to a shop
_AGENT_LINES = _compile(
    r"\b(?:how|what) (?:else )?(?:can|may|could|might) i (?:help|assist|do for) you\b",
    r"\bhow can i be of (?:help|assistance|service)\b",
    r"\banything else (?:that )?(?:i|we) (?:can|could|may) (?:help|assist|do)\b",
    r"\bthanks? (?:you )?(?:so much |very much )?for (?:contacting|reaching out|calling|choosing|shopping|your patience|being a valued|holding|waiting)\b",
    r"\b(?:i|we) (?:sincerely )?apologi[sz]e for (?:the|any) (?:inconvenience|confusion|delay|trouble)\b",
    r"\bsorry for (?:any|the) inconvenience (?:this|that|caused)\b|\bsorry to hear (?:that|about) (?:your|you)\b",
    r"\bfor (?:verification|security) purposes\b|\bverify your identity\b|\bauthenticate you\b",
    r"\byour (?:order|refund|request|account|shipping address|address|package|item|purchase|cancellation|return|exchange)(?: #?\w+)? (?:has been|have been|is being|will be|has now been|is now|was successfully|was processed|was cancell?ed|was canceled|was updated)\b",
    r"\b(?:has|have) been (?:successfully )?(?:issued|processed|cancell?ed|refunded|updated|initiated|changed) (?:to|on|for|in) your\b",
    r"\b(?:i|we)(?:'ve| have)? (?:successfully |now |just |already )?(?:cancell?ed|processed|updated|changed|issued|initiated|submitted|refunded|located|found|pulled up|verified|confirmed) (?:the |that )?(?:your|the refund|a refund|the cancellation)",
    r"\b(?:i|we) (?:see|can see|found|have found|located|checked) (?:that )?your\b",
    r"\bi(?:'ll| will) (?:now )?(?:process|initiate|submit|issue) (?:the|your|a) (?:cancellation|refund|request|change)",
    r"\bshall i (?:proceed|go ahead|cancel|process)\b|\bour (?:records|system|policy|policies)\b",
    r"\b(?:welcome to|thank you for visiting) (?:our|the) (?:shop|store|support)",
    r"\b(?:dear|valued) customer\b|\bfeel free to (?:reach out|contact us|ask)\b|\bcustomer satisfaction\b",
    r"\bi(?:'m| am) (?:here|designed|programmed|built|trained) to (?:help|assist)\b",
    r"\bhave i (?:resolved|answered|addressed) your\b|\bresolve your (?:issue|request|concern)\b",
)
# offers and requests a customer may borrow about their own things ("happy to help you find my account")
_AGENT_OFFERS = _compile(
    r"\b(?:i|we) (?:can|could|will|'ll|would|'d) (?:certainly |definitely |gladly |surely )?(?:help|assist) you\b",
    r"\b(?:i|we)(?:'d| would| will|'ll|'m| am|'re| are)? (?:be )?(?:more than |really )?(?:happy|glad|delighted|pleased|here) to (?:help|assist)\b",
    r"^\W*(?:happy|glad) to (?:help|assist)\b|\b(?:help|assist) you (?:with|in|further|today|better)\b",
    r"\b(?:i|we) can (?:help|assist) with (?:that|this)\b",
    r"\b(?:could|can|would|may|might) (?:you|i) (?:please |kindly )?(?:provide|confirm|share|verify|give me|tell me|have|get|ask for)(?: me)?(?: with)? your (?:email|e-mail|full name|order|zip|zip code|postal|address|account|user id|phone|reason|payment|name and)",
    r"\b(?:please )?(?:provide|confirm|share|verify) (?:me )?(?:with )?(?:your|the) (?:email|e-mail|order (?:number|id)|zip|user id|full name)",
    r"\blet me (?:quickly |just )?(?:check|look|pull|verify|process|see what|handle|take care|help|assist|cancel|update)\w*(?: \w+){0,5} for you\b",
    r"\b(?:i'll|i will) (?:now |go ahead and |quickly )?(?:check|look|pull|verify|process|cancel|update|change|refund|handle|take care)\w*(?: \w+){0,4} for you\b",
    r"\b(?:would you like|do you want) me to (?:proceed|go ahead|cancel|process|refund|issue|update|change|transfer)\b",
)
_OWN_THINGS = re.compile(r"\b(?:my|mine|myself)\b")
_SENTENCE_END = re.compile(r"[.!?\n]")


def _sentence_at(text: str, start: int, end: int) -> str:
    left = max((m.end() for m in _SENTENCE_END.finditer(text, 0, start)), default=0)
    right = _SENTENCE_END.search(text, end)
    return text[left : right.start() if right else len(text)]


def agent_voice(lower: str) -> str | None:
    """A service line: offers help to the customer, asks for the customer's data, reports a done write.

    An offer in a sentence about the speaker's own things ("my order") is a customer's, not flagged.
    """
    found = _first_match(_AGENT_LINES, lower)
    if found is not None:
        return f"service line: {found!r}"
    for pattern in _AGENT_OFFERS:
        for found in pattern.finditer(lower):
            if not _OWN_THINGS.search(_sentence_at(lower, found.start(), found.end())):
                return f"service line: {found.group()!r}"
    return None


# ------------------------------------------------------------------ a model speaking

_SELF_ID = [
    re.compile(p)
    for p in (
        r"\b(?:as|being|i am|i'm)(?: just| only| actually| merely)? an? (?:ai|a\.i\.|artificial intelligence|(?:large )?language model|llm|chat ?bot|bot|virtual assistant|ai assistant|ai model|digital assistant|computer program|machine learning model|simulat\w+)\b",
        r"\bas an? (?:helpful )?assistant\b|\bi(?:'m| am) (?:your|a helpful|an ai|a virtual|just an|only an) assistant\b",
        r"\b(?:language model|user simulator|simulated (?:user|customer|conversation|persona)|customer simulator|role-?play\w*|in character|break(?:ing)? character|out of character|my (?:training|programming|creators?)|knowledge cutoff|training data)\b",
        r"\bi(?: was| am|'m) (?:trained|programmed|designed|created|developed|built) (?:by|to|as)\b",
        r"\b(?:openai|anthropic|chatgpt|gpt-?[345](?:\.\d)?)\b|\b(?:by|from) (?:google|meta|alibaba|mistral|deepseek)\b",
        r"\bi(?:'m| am) (?:claude|qwen|llama|gemini|mistral|deepseek|phi|gemma)\b",
        r"\bi(?:'m| am) not (?:a |an )?(?:real|actual|human) (?:person|customer|human|user|shopper)\b|\bi(?:'m| am) not (?:a )?human\b",
        r"\bi (?:don't|do not|can't|cannot) (?:actually )?(?:have|own|place|make) (?:an? |any )?(?:real|actual|personal|physical) (?:order|orders|account|email|purchases|body|address)\b",
        r"\bi (?:don't|do not) have (?:personal )?(?:feelings|emotions|a physical|a body|personal experiences)\b",
        r"\b(?:i|this) (?:cannot|can't|won't|will not|am unable to|'m unable to) (?:pretend|impersonate|act as|play (?:the|a) (?:role|customer|user))\b",
    )
]


def self_identification(lower: str) -> str | None:
    """The simulator says it is a model, an AI, an assistant, or that this is a role-play."""
    found = _first_match(_SELF_ID, lower)
    return None if found is None else f"speaks as a model: {found!r}"


# ------------------------------------------------------------------ its own prompt

_PROMPT_TALK = [
    re.compile(p)
    for p in (
        r"\bmy (?:instructions|system prompt|prompt|hidden goal|secret goal|directives|script)\b",
        r"\b(?:the|these|those) (?:system prompt|hidden goal|user instructions|secret goal)\b",
        r"\bi(?: was| am|'m| have been) (?:instructed|told|prompted|supposed|meant|required) to (?:play|act|pretend|stay|write|give|only|end|say|keep|never|not|reveal|answer|behave)\b",
        r"^\W*(?:persona|goal|hidden goal|instructions|role|task)\s*:|\bin this (?:scenario|simulation|exercise|role-?play)\b",
        r"\bmy goal is to\b|\bi(?:'m| am) (?:playing|role-?playing|acting as|portraying|pretending to be) (?:a|the) (?:customer|user|shopper|role)\b",
        r"\b(?:my|the) (?:role|persona|character|script|scenario) (?:is|says|tells|requires|wants)\b",
        r"\bstop (?:marker|token|word|signal|sequence|phrase)\b|\bend (?:the|my|each|every) (?:message|reply|conversation|chat) with\b",
        r"\bthe facts below\b|\bonly when (?:the agent )?asked\b.{0,40}\bone piece at a time\b|\bone piece at a time\b.{0,40}\bonly when\b",
        r"\bstay in (?:my|the|your) role\b|\bwrite only what the user says\b|\bnever (?:act as the agent|say (?:i am|you are) an ai)\b",
    )
]


def prompt_talk(lower: str) -> str | None:
    """The reply talks about the simulator's instructions, persona or stop rule."""
    found = _first_match(_PROMPT_TALK, lower)
    return None if found is None else f"talks about its instructions: {found!r}"


_WORD = re.compile(r"[a-z0-9#@$'-]+(?:\.[a-z0-9]+)*")
# first and second person as one, so a prompt written as "You are ..." and leaked as "I am ..." matches
_PERSON = {"you": "i", "me": "i", "your": "my", "yours": "mine", "yourself": "myself", "are": "am",
           "you're": "i'm", "you'll": "i'll", "you've": "i've", "you'd": "i'd", "were": "was"}  # fmt: skip


def normalized_words(text: str, *, fold_person: bool = False) -> list[str]:
    """Lower-case words (``#W1001``, emails and prices kept whole); optionally "you/your" as "I/my".

    Example:
        >>> normalized_words("You are Ann, ann@x.com.", fold_person=True)
        ['i', 'am', 'ann', 'ann@x.com']
    """
    words = _WORD.findall(text.lower().replace("’", "'"))
    return [_PERSON.get(w, w) for w in words] if fold_person else words


def leaked_run(reply: str, source: str, n: int, *, fold_person: bool = False) -> str | None:
    """The first run of ``n`` consecutive words of ``source`` that ``reply`` repeats, or None."""
    words = normalized_words(source, fold_person=fold_person)
    if n < 1 or len(words) < n:
        return None
    said = " " + " ".join(normalized_words(reply, fold_person=fold_person)) + " "
    for start in range(len(words) - n + 1):
        run = " ".join(words[start : start + n])
        if f" {run} " in said:
            return run
    return None


_MARKER_TALK = re.compile(r"\b(?:with|write|writing|type|say|saying|output|add|append|print|use|send|sending|include|marker|token|word|then)\W{0,4}$", re.I)  # fmt: skip


def stop_marker_misuse(raw: str, marker: str) -> str | None:
    """The stop marker quoted or talked about (a leaked stop instruction), not used to end the chat."""
    if not marker or marker not in raw:
        return None
    if raw.count(marker) > 1:
        return f"the stop marker {marker!r} appears {raw.count(marker)} times"
    before, after = raw.split(marker, 1)
    if re.search(r"[a-z]{2,}", after, re.I):
        return f"the stop marker is followed by more text: {after.strip()[:40]!r}"
    if before.rstrip().endswith(("'", '"', "`", "“", "‘")) or after.lstrip().startswith(
        ("'", '"', "`", "”", "’")
    ):
        return "the stop marker is quoted"
    if _MARKER_TALK.search(before.rstrip()):
        return f"the stop marker is talked about: {before.strip()[-40:]!r}"
    return None


# ------------------------------------------------------------------ parroting the agent


def parroted(body: str, agent_message: str, *, min_words: int = 6, share: float = 0.8) -> str | None:
    """The reply is the agent's last message, or at least ``share`` of it is runs of 4+ of its words.

    A customer who echoes one fact back ("So the total is $84.50? Okay.") stays under ``share``.
    """
    reply_words = normalized_words(body)
    agent_words = normalized_words(agent_message)
    if len(reply_words) >= 3 and reply_words == agent_words:
        return "repeats the agent's message"
    if len(reply_words) < min_words or len(agent_words) < 4:
        return None
    grams = {tuple(agent_words[i : i + 4]) for i in range(len(agent_words) - 3)}
    covered = [False] * len(reply_words)
    for i in range(len(reply_words) - 3):
        if tuple(reply_words[i : i + 4]) in grams:
            covered[i : i + 4] = [True] * 4
    fraction = sum(covered) / len(reply_words)
    if fraction >= share:
        return f"{fraction:.0%} of the reply repeats the agent's message"
    return None
