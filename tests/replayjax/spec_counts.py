"""What a speculative completion reports when every draft is right."""


def every_draft_accepted(c, K: int) -> bool:
    """Whether `c`'s counts are those of a drafter that is always right, K drafts a step:
    after the prefill's token, full steps of K + 1 tokens and one cut short by max_new_tokens
    (its kept tokens all drafts)."""
    full, rest = divmod(len(c.tokens) - 1, K + 1)
    return (c.verify_steps, c.accepted_drafts) == (full + (rest > 0), full * K + rest) \
        and c.verify_steps > 0
