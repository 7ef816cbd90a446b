//! The scripted directives of docs/API.md (`[[tool:echo hi]]`, `[[delay:500]]`, ...), read from message text.

/// One directive found in a message's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Directive {
    /// `[[tool:NAME ARGS]]`: the step returns a call of tool NAME with ARGS.
    Tool { name: String, arguments: String },
    /// `[[delay:MS]]`: stream the reply over MS milliseconds.
    Delay { ms: u64 },
    /// `[[max-tokens]]`
    MaxTokens,
    /// `[[fail]]`: the model request fails.
    Fail,
    /// `[[reject]]`: the content guard rejects the proposal.
    Reject,
    /// `[[drop]]`: the content guard leaves this message out of the batch.
    Drop,
    /// `[[rewrite:TEXT]]`: the content guard enters this message with content TEXT.
    Rewrite { text: String },
    /// `[[hook-fail]]`: the content guard fails.
    HookFail,
    /// `[[complete-goal-at:N]]` in a goal's objective: the scripted model calls `goal_complete` in the step
    /// that enters round N's continuation (docs/API.md "The scripted model").
    CompleteGoalAt { round: u64 },
    /// `[[usage:IN,OUT]]`: the step reports a token usage of IN input and OUT output tokens (SPEC §17),
    /// so usage counting and budgets can be tested without a real model.
    Usage { input: u64, output: u64 },
    /// `[[compact-fail]]` anywhere in the turns being summarized: the scripted compaction request fails
    /// (SPEC §13), so tests can pin that a failed compaction changes nothing.
    CompactFail,
    /// `[[system]]`: the reply is `system: PROMPT`, the system prompt of the request (empty when it has
    /// none), so a test sees which agent version answered (SPEC §20).
    System,
}

/// The directives of `text`, in order, and the text with them taken out (trimmed). Anything between
/// `[[` and `]]` that is not a directive stays in the text as it was. Brackets nest, so a directive's
/// argument may hold directives of its own for someone else: `[[tool:spawn_agent researcher [[delay:500]]
/// dig]]` is one tool call whose prompt carries the child's `[[delay:500]]`.
pub fn parse(text: &str) -> (Vec<Directive>, String) {
    let mut directives = Vec::new();
    let mut rest = String::with_capacity(text.len());
    let mut cursor = text;
    while let Some(open) = cursor.find("[[") {
        let Some(close) = matching_close(&cursor[open + 2..]).map(|c| open + 2 + c) else { break };
        let inner = &cursor[open + 2..close];
        match parse_one(inner) {
            Some(d) => {
                rest.push_str(&cursor[..open]);
                directives.push(d);
            }
            None => rest.push_str(&cursor[..close + 2]),
        }
        cursor = &cursor[close + 2..];
    }
    rest.push_str(cursor);
    let cleaned = rest.split_whitespace().collect::<Vec<_>>().join(" ");
    (directives, cleaned)
}

/// Where the `]]` closing a `[[` opened just before `text` stands in `text`, counting nested pairs.
fn matching_close(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        if rest.starts_with("[[") {
            depth += 1;
            at += 2;
        } else if rest.starts_with("]]") {
            if depth == 0 {
                return Some(at);
            }
            depth -= 1;
            at += 2;
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    None
}

fn parse_one(inner: &str) -> Option<Directive> {
    let (name, arg) = match inner.split_once(':') {
        Some((n, a)) => (n.trim(), Some(a.trim())),
        None => (inner.trim(), None),
    };
    Some(match (name, arg) {
        ("tool", Some(spec)) => {
            let (name, arguments) = spec.split_once(' ').unwrap_or((spec, ""));
            Directive::Tool { name: name.to_owned(), arguments: arguments.trim().to_owned() }
        }
        ("delay", Some(ms)) => Directive::Delay { ms: ms.parse().ok()? },
        ("max-tokens", None) => Directive::MaxTokens,
        ("fail", None) => Directive::Fail,
        ("reject", None) => Directive::Reject,
        ("drop", None) => Directive::Drop,
        ("rewrite", Some(text)) => Directive::Rewrite { text: text.to_owned() },
        ("hook-fail", None) => Directive::HookFail,
        ("compact-fail", None) => Directive::CompactFail,
        ("system", None) => Directive::System,
        ("usage", Some(counts)) => {
            let (input, output) = counts.split_once(',')?;
            Directive::Usage { input: input.trim().parse().ok()?, output: output.trim().parse().ok()? }
        }
        ("complete-goal-at", Some(n)) => Directive::CompleteGoalAt { round: n.parse().ok().filter(|n| *n > 0)? },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_combined_directives_and_strips_them() {
        let (d, text) = parse("[[delay:500]] [[tool:echo hi there]] go");
        assert_eq!(
            d,
            vec![Directive::Delay { ms: 500 }, Directive::Tool { name: "echo".into(), arguments: "hi there".into() }]
        );
        assert_eq!(text, "go");
    }

    #[test]
    fn usage_takes_two_counts_and_anything_else_stays_text() {
        assert_eq!(parse("[[usage:120, 7]] hi"), (vec![Directive::Usage { input: 120, output: 7 }], "hi".into()));
        assert_eq!(parse("[[usage:120]]").0, vec![]);
        assert_eq!(parse("[[usage:a,7]]").0, vec![]);
    }

    #[test]
    fn leaves_unknown_brackets_in_the_text() {
        let (d, text) = parse("a [[nope]] b [[delay:x]] [[max-tokens]]");
        assert_eq!(d, vec![Directive::MaxTokens]);
        assert_eq!(text, "a [[nope]] b [[delay:x]]");
    }

    #[test]
    fn rewrite_keeps_its_text_and_unclosed_brackets_stay() {
        let (d, text) = parse("[[rewrite:new words]] old [[oops");
        assert_eq!(d, vec![Directive::Rewrite { text: "new words".into() }]);
        assert_eq!(text, "old [[oops");
    }

    #[test]
    fn brackets_nest_so_an_argument_can_carry_directives_for_another_agent() {
        let (d, text) = parse("[[tool:spawn_agent researcher [[tool:sleep 500]] dig [[delay:9]]]] go");
        assert_eq!(
            d,
            vec![Directive::Tool {
                name: "spawn_agent".into(),
                arguments: "researcher [[tool:sleep 500]] dig [[delay:9]]".into()
            }]
        );
        assert_eq!(text, "go");
        // The inner directives are the child's: they do nothing here.
        assert!(!d.iter().any(|d| matches!(d, Directive::Delay { .. })));
    }

    #[test]
    fn complete_goal_at_takes_a_positive_round() {
        let (d, text) = parse("work [[complete-goal-at:3]] [[complete-goal-at:0]]");
        assert_eq!(d, vec![Directive::CompleteGoalAt { round: 3 }]);
        assert_eq!(text, "work [[complete-goal-at:0]]");
    }
}
