//! Client commands over the public gRPC API.

use anyhow::{Context, Result, bail};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use turnstile_model::message::{MessageSource, SessionRef, Target, UserMessage};
use turnstile_model::{CancelCause, GoalAction, InjectMode, OnDeadline, Status};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;

use crate::args::{DeliverArgs, ListArgs};
use crate::render;

/// Sends `authorization: Bearer <token>` on every call when a token is set.
#[derive(Clone, Debug)]
pub struct Auth(Option<MetadataValue<Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Api = AgentClient<InterceptedService<Channel, Auth>>;

/// A connected client plus the tenant its session names use.
#[derive(Clone, Debug)]
pub struct Client {
    pub api: Api,
    pub tenant: String,
    /// `--json`: replies print in the protobuf JSON mapping ([`Client::print`]).
    pub json: bool,
}

impl Client {
    pub async fn connect(addr: &str, token: Option<&str>, tenant: &str) -> Result<Self> {
        Self::connect_with_ca(addr, token, tenant, None).await
    }

    /// [`Client::connect`]; `https://` addresses are verified against the PEM CA in `ca` (`--ca`).
    pub async fn connect_with_ca(
        addr: &str,
        token: Option<&str>,
        tenant: &str,
        ca: Option<&std::path::Path>,
    ) -> Result<Self> {
        let auth = match token {
            Some(t) => Some(
                MetadataValue::try_from(format!("Bearer {t}"))
                    .context("--token has characters that cannot be sent in a header; use a plain ASCII token")?,
            ),
            None => None,
        };
        let mut endpoint = Channel::from_shared(addr.to_owned())
            .with_context(|| format!("--addr {addr:?} is not a URL; use e.g. http://127.0.0.1:7400"))?;
        match (addr.starts_with("https://"), ca) {
            (true, Some(ca)) => {
                let tls = turnstile_ops::tls::client_config(ca, None, None).context("--ca")?;
                endpoint = endpoint.tls_config(tls).context("cannot set up TLS with --ca")?;
            }
            (true, None) => {
                bail!("--addr {addr} is https://: pass --ca FILE (the CA that signed the gateway's certificate)")
            }
            (false, Some(_)) => bail!("--ca is for TLS: use an https:// --addr"),
            (false, None) => {}
        }
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {addr}; is `turnstile dev` running there? (see --addr)"))?;
        Ok(Self { api: AgentClient::with_interceptor(channel, Auth(auth)), tenant: tenant.to_owned(), json: false })
    }

    pub fn session(&self, id: &str) -> pb::SessionRef {
        pb::SessionRef { tenant: self.tenant.clone(), id: id.to_owned() }
    }

    /// Prints one reply: with `--json` as the message in the protobuf JSON mapping (plus `extra` keys,
    /// [`crate::json::line_with`]), else the `human` line. Every client command prints through here.
    pub fn print<M: prost::Message + prost::Name>(
        &self,
        reply: &M,
        extra: &[(&str, serde_json::Value)],
        human: impl FnOnce(&M) -> String,
    ) -> Result<()> {
        let line = if self.json { crate::json::line_with(reply, extra)? } else { human(reply) };
        println!("{line}");
        Ok(())
    }
}

/// The name of an inject-mode enum value, as the CLI spells it.
fn inject_mode_name(raw: i32) -> &'static str {
    match pb::InjectMode::try_from(raw) {
        Ok(pb::InjectMode::OutOfTurn) => InjectMode::OutOfTurn.as_str(),
        Ok(_) => InjectMode::Pending.as_str(),
        Err(_) => "unknown",
    }
}

/// A fresh client-minted MessageId.
pub fn mint_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A text message; `source: None` leaves the choice to the server's per-preset default.
pub fn text_message(id: &str, text: &str, source: Option<&MessageSource>) -> pb::UserMessage {
    let mut m = codec::encode_user_message(&UserMessage::user_text(id, text));
    m.source = source.map(codec::encode_message_source);
    m
}

/// The line a delivery prints.
pub fn accepted_line(id: &str, reply: &pb::SendReply) -> String {
    match reply.turn {
        Some(turn) => format!("accepted id={id} seq={} turn={turn}", reply.seq),
        None => format!("accepted id={id} seq={}", reply.seq),
    }
}

fn status_name(raw: i32) -> &'static str {
    codec::decode_status(raw).map(Status::as_str).unwrap_or("unknown")
}

pub(crate) fn info_line(info: &pb::SessionInfo) -> String {
    let s = info.session.clone().unwrap_or_default();
    let goal = match &info.goal {
        Some(goal) => format!(" {}", goal_line(goal)),
        None => String::new(),
    };
    let parent = match &info.parent {
        Some(p) => format!(" parent={}/{}", p.tenant, p.id),
        None => String::new(),
    };
    let labels = if info.labels.is_empty() {
        String::new()
    } else {
        let mut pairs: Vec<String> = info.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.sort();
        format!(" labels={}", pairs.join(","))
    };
    let overrides = match info.overrides.clone().map(|o| codec::overrides_at(o, "overrides")) {
        Some(Ok(o)) if !o.is_empty() => format!(" overrides={{{}}}", crate::render::overrides_text(&o)),
        _ => String::new(),
    };
    format!(
        "{}/{} status={} last_seq={} last_turn={} epoch={} owner={} agent={} inject_mode={}{parent}{labels}{overrides}{goal}",
        s.tenant,
        s.id,
        status_name(info.status),
        info.last_seq,
        info.last_turn,
        info.epoch,
        if info.owner.is_empty() { "-" } else { &info.owner },
        if info.agent.is_empty() { "-" } else { &info.agent },
        inject_mode_name(info.inject_mode),
    )
}

pub async fn show_session(client: &mut Client, id: &str) -> Result<()> {
    let info = client.api.get_session(pb::GetSessionRequest { session: Some(client.session(id)) }).await?.into_inner();
    client.print(&info, &[], info_line)
}

/// Prints every page of a listing, one item a line (or as JSON): `page` reads the page at a token and
/// gives its items and the next page's token (empty after the last).
pub async fn print_pages<T: prost::Message + prost::Name>(
    client: &mut Client,
    line: impl Fn(&T) -> String,
    mut page: impl AsyncFnMut(&mut Client, String) -> Result<(Vec<T>, String)>,
) -> Result<()> {
    let mut token = String::new();
    loop {
        let (items, next) = page(client, token).await?;
        for item in &items {
            client.print(item, &[], &line)?;
        }
        if next.is_empty() {
            return Ok(());
        }
        token = next;
    }
}

/// `list`/`sessions`: every page of the sessions the filters select.
pub async fn list(client: &mut Client, args: ListArgs) -> Result<()> {
    let status = match args.status.as_deref() {
        None => pb::SessionStatus::Unspecified,
        Some("idle") => pb::SessionStatus::Idle,
        Some("running") => pb::SessionStatus::Running,
        Some(other) => anyhow::bail!("--status {other:?} is not a status; use idle or running"),
    };
    let order_by = if args.recent { pb::SessionOrder::LastActivity } else { pb::SessionOrder::Id };
    print_pages(client, info_line, async |client, page_token| {
        let tenant = if args.all_tenants { String::new() } else { client.tenant.clone() };
        let request = pb::ListSessionsRequest {
            page_token,
            page_size: 0,
            tenant,
            parent: args.parent.clone().unwrap_or_default(),
            status: status.into(),
            agent: args.agent.clone().unwrap_or_default(),
            label_selector: args.label.clone().unwrap_or_default(),
            updated_after_unix_ms: None,
            updated_before_unix_ms: None,
            order_by: order_by.into(),
            agent_version: 0,
        };
        let reply = client.api.list_sessions(request).await?.into_inner();
        Ok((reply.sessions, reply.next_page_token))
    })
    .await
}

/// `usage`: the tenant's tokens per model over the last `days` UTC days (0: all kept) and its budget.
pub async fn usage(client: &mut Client, days: u64) -> Result<()> {
    let since_unix_ms = match days {
        0 => 0,
        n => {
            let today = turnstile_model::usage::day_of(turnstile_ops::clock::now_ms());
            turnstile_model::usage::day_start_ms(today.saturating_sub(n - 1)).max(1)
        }
    };
    let request = pb::GetUsageRequest { tenant: client.tenant.clone(), since_unix_ms };
    let reply = client.api.get_usage(request).await?.into_inner();
    client.print(&reply, &[], usage_text)
}

fn usage_text(u: &pb::TenantUsage) -> String {
    use turnstile_model::time::rfc3339_utc;
    let budget = if u.budget == 0 { "no token budget".to_owned() } else { format!("token budget {}", u.budget) };
    let mut out = format!(
        "tenant {}: {} tokens used today (UTC), {budget}, resets {}\nsince {}:\n",
        u.tenant,
        u.used_today,
        rfc3339_utc(u.resets_unix_ms),
        rfc3339_utc(u.since_unix_ms)
    );
    out.push_str(&format!("{:<40} {:>12} {:>12} {:>12} {:>12}", "model", "input", "output", "cached", "cache-write"));
    if u.models.is_empty() {
        out.push_str("\n(no usage)");
    }
    for m in &u.models {
        let name = if m.provider.is_empty() { m.model.clone() } else { format!("{}/{}", m.provider, m.model) };
        out.push_str(&format!(
            "\n{name:<40} {:>12} {:>12} {:>12} {:>12}",
            m.input_tokens, m.output_tokens, m.cached_input_tokens, m.cache_write_tokens
        ));
    }
    out
}

pub async fn inbox(client: &mut Client, id: &str) -> Result<()> {
    let snapshot = client.api.get_inbox(pb::GetInboxRequest { session: Some(client.session(id)) }).await?.into_inner();
    if client.json {
        return client.print(&snapshot, &[], |_| String::new());
    }
    let (seq, inbox) = codec::decode_inbox_snapshot(snapshot).context("the server sent an invalid inbox")?;
    // An empty tenant is the token's: the id alone names the session.
    let name = if client.tenant.is_empty() { id.to_owned() } else { format!("{}/{id}", client.tenant) };
    println!("inbox of {name} at seq {seq}");
    for (name, list) in [("next-turn", &inbox.next_turn), ("next-step", &inbox.next_step)] {
        println!("{name} ({})", list.len());
        for (i, m) in list.iter().enumerate() {
            println!("  {i:>3}  {}  {}{}", m.id, render::preview(&m.text()), source_note(&m.source));
        }
    }
    Ok(())
}

fn source_note(source: &MessageSource) -> String {
    match source {
        MessageSource::User => String::new(),
        other => format!("  ({})", other.kind()),
    }
}

pub async fn wait_idle(client: &mut Client, id: &str, timeout_ms: u64) -> Result<()> {
    let info =
        client.api.when_idle(pb::WhenIdleRequest { session: Some(client.session(id)), timeout_ms }).await?.into_inner();
    client.print(&info, &[], |info| format!("idle seq={} turn={}", info.last_seq, info.last_turn))
}

/// The arguments a delivery command shares.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub session: String,
    pub text: String,
    pub id: Option<String>,
    pub source: Option<MessageSource>,
}

impl From<DeliverArgs> for Delivery {
    /// The delivery the command line describes: the words of the text joined by spaces.
    fn from(args: DeliverArgs) -> Self {
        let source = args.message.source.map(|s| s.0);
        Self { session: args.session, text: args.text.join(" "), id: args.message.id, source }
    }
}

/// Which delivery RPC to call.
#[derive(Clone, Copy, Debug)]
pub enum Preset {
    Followup,
    Queue,
    /// A steer; with `deadline_ms`, `on_deadline` (`None`: the server's default, interrupt) applies to it
    /// if it is still pending then (SPEC §11).
    Steer {
        expected_turn: Option<u64>,
        deadline_ms: Option<u64>,
        on_deadline: Option<OnDeadline>,
    },
    Inject,
    Interrupt,
    Send {
        target: Target,
        wakeup: bool,
    },
}

/// Delivers one message and returns its id and the reply.
pub async fn deliver(client: &mut Client, preset: Preset, d: &Delivery) -> Result<(String, pb::SendReply)> {
    let id = d.id.clone().unwrap_or_else(mint_id);
    let message = Some(text_message(&id, &d.text, d.source.as_ref()));
    let session = Some(client.session(&d.session));
    let deliver = || pb::DeliverRequest { session: session.clone(), message: message.clone(), output_schema: None };
    let reply = match preset {
        Preset::Followup => client.api.followup(deliver()).await?,
        Preset::Queue => client.api.queue(deliver()).await?,
        Preset::Inject => client.api.inject(deliver()).await?,
        Preset::Interrupt => client.api.interrupt(deliver()).await?,
        Preset::Steer { expected_turn, deadline_ms, on_deadline } => {
            let on_deadline = on_deadline.map_or(0, |d| codec::encode_on_deadline(d) as i32);
            let request = pb::SteerRequest {
                session: session.clone(),
                message: message.clone(),
                expected_turn,
                deadline_ms,
                on_deadline,
            };
            client.api.steer(request).await?
        }
        Preset::Send { target, wakeup } => {
            let target = codec::encode_target(target) as i32;
            client
                .api
                .send(pb::SendRequest { session: session.clone(), message: message.clone(), target, wakeup })
                .await?
        }
    };
    Ok((id, reply.into_inner()))
}

pub async fn cancel(client: &mut Client, id: &str, cause: CancelCause, keep_inbox: bool) -> Result<()> {
    let request = pb::CancelRequest {
        session: Some(client.session(id)),
        cause: Some(codec::encode_cancel_cause(&cause)),
        keep_inbox,
    };
    let reply = client.api.cancel(request).await?.into_inner();
    client.print(&reply, &[], |r| format!("canceled seq={}", r.seq))
}

pub async fn replace(
    client: &mut Client,
    session: &str,
    id: &str,
    text: &str,
    new_id: Option<&str>,
    source: Option<&MessageSource>,
) -> Result<()> {
    // Rewriting content keeps the id (SPEC §1) unless the caller names a new one.
    let new_id = new_id.unwrap_or(id);
    let request = pb::ReplaceRequest {
        session: Some(client.session(session)),
        id: id.to_owned(),
        message: Some(text_message(new_id, text, source)),
    };
    let reply = client.api.replace(request).await?.into_inner();
    client.print(&reply, &[("id", new_id.into())], |r| format!("replaced id={id} with id={new_id} seq={}", r.seq))
}

pub async fn remove(client: &mut Client, session: &str, id: &str) -> Result<()> {
    let request = pb::RemoveRequest { session: Some(client.session(session)), id: id.to_owned() };
    let reply = client.api.remove(request).await?.into_inner();
    client.print(&reply, &[], |r| format!("removed id={id} seq={}", r.seq))
}

pub async fn splice(
    client: &mut Client,
    session: &str,
    target: Target,
    start: u32,
    delete: u32,
    texts: &[String],
    source: Option<&MessageSource>,
) -> Result<()> {
    let ids: Vec<String> = texts.iter().map(|_| mint_id()).collect();
    let inserted = ids.iter().zip(texts).map(|(id, t)| text_message(id, t, source)).collect();
    let request = pb::SpliceRequest {
        session: Some(client.session(session)),
        target: codec::encode_target(target) as i32,
        start,
        delete_count: delete,
        inserted,
    };
    let reply = client.api.splice(request).await?.into_inner();
    let line = ids.iter().map(|id| format!(" id={id}")).collect::<String>();
    client.print(&reply, &[("ids", ids.into())], |r| format!("spliced seq={}{line}", r.seq))
}

/// `configure SESSION --agent NAME [--inject-mode MODE] [--system-prompt TEXT] [--model NAME] [--tools A,B]`:
/// prints the session as `session` does.
pub async fn configure(
    client: &mut Client,
    session: &str,
    agent: &str,
    inject_mode: InjectMode,
    version: u64,
    overrides: &turnstile_model::overrides::SessionOverrides,
) -> Result<()> {
    let request = pb::ConfigureSessionRequest {
        session: Some(client.session(session)),
        agent: agent.to_owned(),
        inject_mode: codec::encode_inject_mode(inject_mode).into(),
        version,
        overrides: (!overrides.is_empty()).then(|| codec::encode_overrides(overrides)),
    };
    let info = client.api.configure_session(request).await?.into_inner();
    client.print(&info, &[], |info| format!("configured {}", info_line(info)))
}

/// `decide SESSION CALL_ID --approve|--deny [--reason TEXT]`.
pub async fn decide(client: &mut Client, session: &str, call_id: &str, approve: bool, reason: &str) -> Result<()> {
    let request = pb::DecideRequest {
        session: Some(client.session(session)),
        call_id: call_id.to_owned(),
        approve,
        reason: reason.to_owned(),
    };
    let reply = client.api.decide(request).await?.into_inner();
    let verdict = if approve { "approved" } else { "denied" };
    client.print(&reply, &[], |r| format!("{verdict} call_id={call_id} seq={}", r.seq))
}

/// `compact SESSION` (SPEC §13).
pub async fn compact(client: &mut Client, session: &str) -> Result<()> {
    let request = pb::CompactRequest { session: Some(client.session(session)) };
    let reply = client.api.compact(request).await?.into_inner();
    client.print(&reply, &[], |r| format!("compacted seq={}", r.seq))
}

/// `fork SESSION --at-turn N --new NEW` (SPEC §13): prints the new session as `session` does.
pub async fn fork(client: &mut Client, session: &str, at_turn: u64, new_session: &str) -> Result<()> {
    let request =
        pb::ForkSessionRequest { session: Some(client.session(session)), at_turn, new_session: new_session.to_owned() };
    let info = client.api.fork_session(request).await?.into_inner();
    client.print(&info, &[], |i| format!("forked {}", info_line(i)))
}

/// `reference SESSION FROM_SESSION [--upto-turn N] [--id ID]` (SPEC §13).
pub async fn reference(
    client: &mut Client,
    session: &str,
    from_session: &str,
    upto_turn: Option<u64>,
    id: Option<String>,
) -> Result<()> {
    let id = id.unwrap_or_else(mint_id);
    let request = pb::ReferenceSessionRequest {
        session: Some(client.session(session)),
        from_session: Some(client.session(from_session)),
        upto_turn,
        message_id: id.clone(),
    };
    let reply = client.api.reference_session(request).await?.into_inner();
    client.print(&reply, &[("id", id.clone().into())], |r| format!("referenced id={id} seq={}", r.seq))
}

/// `goal set SESSION --max-rounds N OBJECTIVE`.
pub async fn set_goal(client: &mut Client, session: &str, objective: &str, max_rounds: u32) -> Result<()> {
    let request =
        pb::SetGoalRequest { session: Some(client.session(session)), objective: objective.to_owned(), max_rounds };
    let goal = client.api.set_goal(request).await?.into_inner();
    client.print(&goal, &[], goal_line)
}

/// `goal pause|resume|clear SESSION [--goal-id ID]`; without an id, the session's current goal.
pub async fn update_goal(
    client: &mut Client,
    session: &str,
    goal_id: Option<String>,
    action: GoalAction,
) -> Result<()> {
    let goal_id = match goal_id {
        Some(id) => id,
        None => {
            let request = pb::GetSessionRequest { session: Some(client.session(session)) };
            let info = client.api.get_session(request).await?.into_inner();
            match info.goal {
                Some(goal) => goal.goal_id,
                None => bail!("session {session} has no goal; start one with `turnstile goal set`"),
            }
        }
    };
    let request = pb::UpdateGoalRequest {
        session: Some(client.session(session)),
        goal_id,
        action: codec::encode_goal_action(action).into(),
    };
    let goal = client.api.update_goal(request).await?.into_inner();
    client.print(&goal, &[], goal_line)
}

/// `goal ID rev R STATE round R/MAX: OBJECTIVE`, then the summary or reason.
fn goal_line(goal: &pb::GoalInfo) -> String {
    let mut line = format!(
        "goal {} rev {} {} round {}/{}: {}",
        goal.goal_id, goal.revision, goal.state, goal.round, goal.max_rounds, goal.objective
    );
    if let Some(summary) = &goal.summary {
        line.push_str(&format!(" summary={summary:?}"));
    }
    if let Some(reason) = &goal.reason {
        line.push_str(&format!(" reason={reason:?}"));
    }
    line
}

pub async fn clear(client: &mut Client, session: &str) -> Result<()> {
    let reply = client.api.clear(pb::ClearRequest { session: Some(client.session(session)) }).await?.into_inner();
    client.print(&reply, &[], |r| format!("cleared seq={}", r.seq))
}

/// `delete SESSION`: prints the last seq the deleted log had.
pub async fn delete(client: &mut Client, session: &str) -> Result<()> {
    let request = pb::DeleteSessionRequest { session: Some(client.session(session)) };
    let reply = client.api.delete_session(request).await?.into_inner();
    client.print(&reply, &[], |r| format!("deleted session {session} (its log ended at seq {})", r.seq))
}

/// The session name a client command was given, checked before any call so a typo fails fast.
pub fn check_session(tenant: &str, id: &str) -> Result<()> {
    // An empty tenant is the token's, filled in by the server; check the id against any valid tenant.
    let tenant = if tenant.is_empty() { "default" } else { tenant };
    if let Err(e) = SessionRef::new(tenant, id) {
        bail!("{e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_leave_the_source_to_the_server_unless_given() {
        let m = text_message("m1", "hi", None);
        assert!(m.source.is_none());
        let m = text_message("m1", "hi", Some(&MessageSource::Tool { call_id: "c".into() }));
        assert!(m.source.is_some());
        assert_eq!(m.id, "m1");
    }

    #[test]
    fn the_accepted_line_shows_a_turn_only_when_one_opened() {
        assert_eq!(accepted_line("a", &pb::SendReply { seq: 4, turn: Some(2) }), "accepted id=a seq=4 turn=2");
        assert_eq!(accepted_line("a", &pb::SendReply { seq: 4, turn: None }), "accepted id=a seq=4");
    }
}
