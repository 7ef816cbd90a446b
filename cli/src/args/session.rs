//! The flags of the commands that act on one session: deliveries, steers, edits of the inbox, cancel,
//! configure, approvals, references, forks and goals.

use clap::{Args, Subcommand};

use super::values::{CauseArg, InjectModeArg, SourceArg, TargetArg};

#[derive(Args, Debug)]
pub(crate) struct MessageArgs {
    /// MessageId (default: a fresh UUID v4; reuse one to retry safely).
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// user | plugin[:NAME[:FORM]] | goal:ID:REV:ROUND | tool:CALL_ID | model:PROVIDER:MODEL
    /// (default: the server's, `user`, or `plugin` for inject).
    #[arg(long)]
    pub(crate) source: Option<SourceArg>,
}

#[derive(Args, Debug)]
pub(crate) struct DeliverArgs {
    pub(crate) session: String,
    /// Message text; several words are joined by spaces.
    #[arg(required = true, num_args = 1..)]
    pub(crate) text: Vec<String>,
    #[command(flatten)]
    pub(crate) message: MessageArgs,
}

#[derive(Args, Debug)]
pub(crate) struct SteerArgs {
    #[command(flatten)]
    pub(crate) delivery: DeliverArgs,
    /// Refuse unless the session is running this turn.
    #[arg(long)]
    pub(crate) expected_turn: Option<u64>,
    /// If the steer is still pending this many milliseconds after it was accepted, apply --on-deadline.
    #[arg(long)]
    pub(crate) deadline_ms: Option<u64>,
    /// interrupt (cancel the turn and run the steer next, the default) | drop (remove the steer).
    #[arg(long, requires = "deadline_ms")]
    pub(crate) on_deadline: Option<OnDeadlineArg>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum OnDeadlineArg {
    Interrupt,
    Drop,
}

impl From<OnDeadlineArg> for turnstile_model::OnDeadline {
    fn from(arg: OnDeadlineArg) -> Self {
        match arg {
            OnDeadlineArg::Interrupt => Self::Interrupt,
            OnDeadlineArg::Drop => Self::Drop,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct SendArgs {
    #[command(flatten)]
    pub(crate) delivery: DeliverArgs,
    /// next-turn | next-step
    #[arg(long)]
    pub(crate) target: TargetArg,
    /// Start the agent if it is idle.
    #[arg(long)]
    pub(crate) wakeup: bool,
}

#[derive(Args, Debug)]
pub(crate) struct CancelArgs {
    pub(crate) session: String,
    /// Keep pending messages (they park until the next waking delivery).
    #[arg(long)]
    pub(crate) keep_inbox: bool,
    /// user | parent | hook:REASON | disposed
    #[arg(long, default_value = "user")]
    pub(crate) cause: CauseArg,
}

#[derive(Args, Debug)]
pub(crate) struct ReplaceArgs {
    pub(crate) session: String,
    /// The pending message to replace.
    pub(crate) id: String,
    #[arg(required = true, num_args = 1..)]
    pub(crate) text: Vec<String>,
    /// Id of the replacement (default: the same id).
    #[arg(long)]
    pub(crate) new_id: Option<String>,
    #[arg(long)]
    pub(crate) source: Option<SourceArg>,
}

#[derive(Args, Debug)]
pub(crate) struct RemoveArgs {
    pub(crate) session: String,
    pub(crate) id: String,
}

#[derive(Args, Debug)]
pub(crate) struct SpliceArgs {
    pub(crate) session: String,
    /// next-turn | next-step
    #[arg(long)]
    pub(crate) target: TargetArg,
    #[arg(long)]
    pub(crate) start: u32,
    #[arg(long)]
    pub(crate) delete: u32,
    /// One inserted message per TEXT (quote texts with spaces); ids are minted.
    pub(crate) text: Vec<String>,
    #[arg(long)]
    pub(crate) source: Option<SourceArg>,
}

#[derive(Args, Debug)]
pub(crate) struct ConfigureArgs {
    pub(crate) session: String,
    /// One of the agents of the server's configuration (`scripted` without one).
    #[arg(long)]
    pub(crate) agent: String,
    /// pending | out-of-turn: what an inject to an idle session does (SPEC §11).
    #[arg(long, default_value = "pending")]
    pub(crate) inject_mode: InjectModeArg,
    /// The version of the agent to run (default: its newest; SPEC §20).
    #[arg(long, default_value_t = 0)]
    pub(crate) agent_version: u64,
    /// An extra system prompt, sent after the agent's (the agent must allow it; SPEC §20).
    #[arg(long)]
    pub(crate) system_prompt: Option<String>,
    /// Run this model of the agent's `overrides.models` instead of its own.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Offer only these of the agent's tools, as it lists them (`--tools clock,echo`).
    #[arg(long, value_delimiter = ',', conflicts_with = "no_tools")]
    pub(crate) tools: Option<Vec<String>>,
    /// Offer none of the agent's tools.
    #[arg(long)]
    pub(crate) no_tools: bool,
}

impl ConfigureArgs {
    /// The overrides asked for: every configure sets them all, so a flag left out is no override.
    pub(crate) fn overrides(&self) -> turnstile_model::overrides::SessionOverrides {
        turnstile_model::overrides::SessionOverrides {
            system_prompt: self.system_prompt.clone(),
            model: self.model.clone(),
            tools: if self.no_tools { Some(Vec::new()) } else { self.tools.clone() },
        }
    }
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("verdict").required(true).args(["approve", "deny"]))]
pub(crate) struct DecideArgs {
    pub(crate) session: String,
    /// The call id of the `tool/call` event marked AWAITING APPROVAL.
    pub(crate) call_id: String,
    /// Run the tool.
    #[arg(long)]
    pub(crate) approve: bool,
    /// Do not run it: the model gets the error result `denied: REASON`.
    #[arg(long)]
    pub(crate) deny: bool,
    /// Why (recorded in `tool/decision`; the model sees it on a denial).
    #[arg(long, default_value = "")]
    pub(crate) reason: String,
}

#[derive(Args, Debug)]
pub(crate) struct ReferenceArgs {
    /// The session that gets the reference.
    pub(crate) session: String,
    /// The session whose transcript is referenced (same tenant).
    pub(crate) from_session: String,
    /// The last turn of FROM_SESSION to include (a finished turn); default all of it.
    #[arg(long)]
    pub(crate) upto_turn: Option<u64>,
    /// The injected message's id (default: a new UUID).
    #[arg(long)]
    pub(crate) id: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ForkArgs {
    /// The source session.
    pub(crate) session: String,
    /// The source's last turn to copy (a finished turn, from 1).
    #[arg(long)]
    pub(crate) at_turn: u64,
    /// The new session's id (in the same tenant; it must have no events).
    #[arg(long = "new")]
    pub(crate) new_session: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum GoalCmd {
    /// Start a goal (rounds begin once the session is idle with nothing pending); on a session whose goal
    /// is active or paused, revise it (revision + 1, round 0).
    Set(GoalSetArgs),
    /// Let the running round finish and start no other.
    Pause(GoalUpdateArgs),
    /// Continue a paused goal from the round it stopped at.
    Resume(GoalUpdateArgs),
    /// End the goal; no further rounds.
    Clear(GoalUpdateArgs),
}

#[derive(Args, Debug)]
pub(crate) struct GoalSetArgs {
    pub(crate) session: String,
    /// Continuation rounds the goal may run (1..=the server's limits.max_goal_rounds, default cap 100).
    #[arg(long)]
    pub(crate) max_rounds: u32,
    /// What to work toward (words are joined with spaces).
    #[arg(required = true)]
    pub(crate) objective: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct GoalUpdateArgs {
    pub(crate) session: String,
    /// The goal's id (default: the session's current goal, read with GetSession).
    #[arg(long)]
    pub(crate) goal_id: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct SessionArg {
    pub(crate) session: String,
}
