//! Parts of durable events (SPEC §5) that hold no other event: a compaction, model references and usage,
//! and a goal's change.

use crate::v1 as pb;

use super::error::{CodecError, index, join};
use turnstile_model::event::{Compaction, ModelRef, Usage};
use turnstile_model::goal::{GoalChange, GoalState, MAX_GOAL_ID_LEN};
use turnstile_model::overrides::SessionOverrides;

pub(crate) fn encode_compaction(c: &Compaction) -> pb::ContextCompacted {
    pb::ContextCompacted {
        upto_turn: c.upto_turn,
        summary: c.summary.clone(),
        summarized_turns: c.summarized_turns,
        from_turn: c.from_turn,
    }
}

pub(crate) fn compaction_at(c: pb::ContextCompacted, path: &str) -> Result<Compaction, CodecError> {
    if c.upto_turn == 0 {
        return Err(CodecError::invalid(join(path, "upto_turn"), "is 0; a compaction covers at least turn 1"));
    }
    if c.from_turn > c.upto_turn {
        return Err(CodecError::invalid(join(path, "from_turn"), "is after upto_turn"));
    }
    Ok(Compaction {
        upto_turn: c.upto_turn,
        from_turn: c.from_turn,
        summary: c.summary,
        summarized_turns: c.summarized_turns,
    })
}

pub(crate) fn encode_model_ref(m: &ModelRef) -> pb::ModelRef {
    pb::ModelRef { provider: m.provider.clone(), model: m.model.clone() }
}

pub(crate) fn decode_model_ref(m: pb::ModelRef) -> ModelRef {
    ModelRef { provider: m.provider, model: m.model }
}

/// A model request's token usage on the wire.
pub fn encode_usage(u: &Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_input_tokens: u.cached_input_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

/// [`encode_usage`]'s inverse; fields a writer before SPEC §17 did not set read as 0.
pub fn decode_usage(u: pb::Usage) -> Usage {
    Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_input_tokens: u.cached_input_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

pub(crate) fn goal_change(g: pb::GoalChange) -> Result<GoalChange, CodecError> {
    if g.goal_id.is_empty() || g.goal_id.len() > MAX_GOAL_ID_LEN {
        return Err(CodecError::invalid(
            "goal_change.goal_id",
            format!("must be 1–{MAX_GOAL_ID_LEN} bytes (got {})", g.goal_id.len()),
        ));
    }
    if g.revision == 0 {
        return Err(CodecError::invalid("goal_change.revision", "is 0; revisions start at 1"));
    }
    if g.max_rounds == 0 {
        return Err(CodecError::invalid("goal_change.max_rounds", "is 0; a goal runs at least one round"));
    }
    let Some(state) = GoalState::parse(&g.state) else {
        return Err(CodecError::invalid(
            "goal_change.state",
            format!("`{}` is not a goal state (active, paused, completed, budget-limited, cleared)", g.state),
        ));
    };
    Ok(GoalChange {
        goal_id: g.goal_id,
        revision: g.revision,
        state,
        objective: g.objective,
        max_rounds: g.max_rounds,
        round: g.round,
        summary: g.summary,
        reason: g.reason,
    })
}

/// A session's overrides (SPEC §20) as `SessionOverrides`.
pub fn encode_overrides(o: &SessionOverrides) -> pb::SessionOverrides {
    pb::SessionOverrides {
        system_prompt: o.system_prompt.clone(),
        model: o.model.clone(),
        tools: o.tools.as_ref().map(|tools| pb::ToolSubset { tools: tools.clone() }),
    }
}

/// The inverse of [`encode_overrides`]: an empty model or tool name is refused, naming the field under
/// `path`; an empty system prompt is no override. Whether the agent allows them is the driver's to check.
pub fn overrides_at(o: pb::SessionOverrides, path: &str) -> Result<SessionOverrides, CodecError> {
    if o.model.as_deref() == Some("") {
        return Err(CodecError::invalid(
            join(path, "model"),
            "is empty; name one of the models the agent allows, or leave it out",
        ));
    }
    let tools = o.tools.map(|t| t.tools);
    if let Some(i) = tools.iter().flatten().position(String::is_empty) {
        return Err(CodecError::invalid(
            index(&join(path, "tools"), i),
            "is empty; name one of the agent's tools as it lists them",
        ));
    }
    Ok(SessionOverrides { system_prompt: o.system_prompt.filter(|p| !p.is_empty()), model: o.model, tools })
}
