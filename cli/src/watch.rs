//! `turnstile watch`: a session's events as they happen, across dropped connections.
//!
//! A lost stream (a gateway restart, a dropped connection) is reopened with the last durable seq shown and,
//! for a reply that was streaming, the byte offsets already shown (`resume`, SPEC §14): the output goes on
//! exactly where it stopped, nothing missing and nothing twice, as if the stream had never broken. The
//! notes about reconnecting go to stderr, so stdout is the same as an unbroken watch's.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use tonic::Code;
use turnstile_model::{EventPayload, LivePayload, Status};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

use crate::client::Client;
use crate::render::{self, Renderer};

/// What `watch` does.
#[derive(Clone, Debug)]
pub struct WatchOpts {
    pub after: u64,
    pub live: bool,
    /// Stop once the session is idle after catching up.
    pub until_idle: bool,
    /// How long to keep trying to reopen a lost stream before giving up (zero: do not reconnect).
    pub reconnect_for: Duration,
}

/// Where the output stands: the last durable seq shown, and of a reply streaming now, the next byte
/// offsets of its text and reasoning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Position {
    seq: u64,
    step: Option<pb::StreamResume>,
}

impl Position {
    fn delta(&mut self, turn: u64, step: u32, reasoning: bool, offset: u64, len: usize) {
        let resume = match &mut self.step {
            Some(r) if r.turn == turn && r.step == step => r,
            other => other.insert(pb::StreamResume { turn, step, text_offset: 0, reasoning_offset: 0 }),
        };
        let next = if reasoning { &mut resume.reasoning_offset } else { &mut resume.text_offset };
        *next = (*next).max(offset + len as u64);
    }

    /// A durable event: a step that ended no longer streams.
    fn event(&mut self, payload: &EventPayload) {
        let ended = match payload {
            EventPayload::AssistantMessage { turn, step, .. } | EventPayload::StepEnd { turn, step, .. } => {
                Some((*turn, *step))
            }
            EventPayload::TurnEnd { .. } => self.step.map(|r| (r.turn, r.step)),
            _ => None,
        };
        if ended.is_some() && ended == self.step.map(|r| (r.turn, r.step)) {
            self.step = None;
        }
    }
}

/// How one stream ended.
enum Ended {
    /// The caller is done (`--until-idle`), or the server ended the stream for good.
    Done,
    /// The stream broke; reopen it from the position.
    Lost(String),
}

/// Streams a session's events to `out` until the stream ends (or, with `until_idle`, the session is idle),
/// reopening it when it breaks. Calls `on_seq` with each durable seq written.
pub async fn watch(
    client: &mut Client,
    id: &str,
    opts: &WatchOpts,
    out: &mut (dyn Write + Send),
    mut on_seq: impl FnMut(u64) + Send,
) -> Result<()> {
    // `out` is stdout for every caller (`watch`, the demo).
    let mut renderer = Renderer::with_color(render::stdout_color());
    let mut position = Position { seq: opts.after, step: None };
    let mut opened = 0u32;
    let mut lost_since: Option<tokio::time::Instant> = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        let request = pb::WatchRequest {
            session: Some(client.session(id)),
            after_seq: position.seq,
            live: opts.live,
            resume: position.step,
        };
        let reason = match client.api.watch(request).await {
            Ok(stream) => {
                opened += 1;
                let first = opened == 1;
                let ended = follow(
                    client,
                    id,
                    opts,
                    stream.into_inner(),
                    first,
                    &mut position,
                    &mut renderer,
                    out,
                    &mut on_seq,
                );
                match ended.await? {
                    Ended::Done => break,
                    Ended::Lost(reason) => {
                        // It was open: the next attempt starts a new reconnect period.
                        (lost_since, backoff) = (None, Duration::from_millis(100));
                        reason
                    }
                }
            }
            Err(status) if opened > 0 && reconnectable(status.code()) => status.message().to_owned(),
            Err(status) => return Err(status.into()),
        };
        let since = *lost_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= opts.reconnect_for {
            bail!(
                "the watch stream of session {id} was lost ({reason}) and could not be reopened for {:?}; run \
                 `turnstile watch {id} --after {}` to go on from the last event shown",
                opts.reconnect_for,
                position.seq
            );
        }
        eprintln!("turnstile: watch stream lost ({reason}); reopening after #{}", position.seq);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    out.write_all(renderer.finish().as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Codes of a stream that broke rather than ended: a gateway going away, a dropped connection.
fn reconnectable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted)
}

/// Renders one stream's items until it ends.
#[allow(clippy::too_many_arguments)] // one call site; the pieces are the watch's state
async fn follow(
    client: &Client,
    id: &str,
    opts: &WatchOpts,
    mut stream: tonic::Streaming<pb::WatchItem>,
    first: bool,
    position: &mut Position,
    renderer: &mut Renderer,
    out: &mut (dyn Write + Send),
    on_seq: &mut (impl FnMut(u64) + Send),
) -> Result<Ended> {
    let mut caught_up = false;
    loop {
        let item = match stream.next().await {
            Some(Ok(item)) => item,
            Some(Err(status)) if reconnectable(status.code()) && !opts.reconnect_for.is_zero() => {
                return Ok(Ended::Lost(status.message().to_owned()));
            }
            Some(Err(status)) => return Err(status.into()),
            // Servers end a Watch with a status; a bare end is a connection that went away.
            None if !opts.reconnect_for.is_zero() => return Ok(Ended::Lost("stream ended".into())),
            None => return Ok(Ended::Done),
        };
        // `--json`: the item as the server sent it, in the protobuf JSON mapping.
        let json = if client.json { Some(format!("{}\n", crate::json::line(&item)?)) } else { None };
        let mut idle_now = false;
        let text = match item.item {
            Some(pb::watch_item::Item::Event(e)) => {
                let e = codec::decode_session_event(e).context("the server sent an invalid event")?;
                on_seq(e.seq);
                position.seq = e.seq;
                position.event(&e.payload);
                idle_now = caught_up && matches!(e.payload, EventPayload::Status(Status::Idle));
                json.unwrap_or_else(|| renderer.event(&e))
            }
            Some(pb::watch_item::Item::Live(l)) => {
                let l = codec::decode_live_event(l).context("the server sent an invalid live event")?;
                if let LivePayload::AssistantDelta { turn, step, text, reasoning, offset } = &l.payload {
                    position.delta(*turn, *step, *reasoning, *offset, text.len());
                }
                json.unwrap_or_else(|| renderer.live(&l))
            }
            Some(pb::watch_item::Item::CaughtUp(c)) => {
                caught_up = true;
                let status = codec::decode_status(c.status).context("the server sent an invalid status")?;
                let (_, inbox) = codec::decode_inbox_snapshot(c.inbox.unwrap_or_default())
                    .context("the server sent an invalid inbox")?;
                on_seq(c.seq);
                position.seq = position.seq.max(c.seq);
                // Already idle: there is nothing to wait for (a turn that finished before we connected is in
                // the history above).
                idle_now = status == Status::Idle;
                // A reopened stream's marker is not shown: the output reads as one unbroken stream.
                match json {
                    Some(json) => json,
                    None if first => renderer.caught_up(c.seq, status, &inbox),
                    None => String::new(),
                }
            }
            None => continue,
        };
        out.write_all(text.as_bytes())?;
        out.flush()?;
        if opts.until_idle && idle_now && settled(client, id, position.seq).await? {
            return Ok(Ended::Done);
        }
    }
}

/// An idle seen at `seq` is final when `WhenIdle` (idle *and* no latched wake, SPEC §4) answers with
/// that same seq; a latched wake restarts the driver and the watch goes on to the next idle.
async fn settled(client: &Client, id: &str, seq: u64) -> Result<bool> {
    let mut api = client.api.clone();
    let info = api.when_idle(pb::WhenIdleRequest { session: Some(client.session(id)), timeout_ms: 0 }).await;
    match info {
        Ok(info) => Ok(info.into_inner().last_seq <= seq),
        // Still busy after the server's default wait: keep watching for the next idle.
        Err(status) if status.code() == Code::DeadlineExceeded => Ok(false),
        // A session with no events yet is as idle as it gets.
        Err(status) if status.code() == Code::NotFound => Ok(true),
        Err(status) => Err(status.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_follows_deltas_and_forgets_a_step_that_ended() {
        let mut p = Position { seq: 6, step: None };
        p.delta(1, 1, false, 0, 6);
        p.delta(1, 1, true, 0, 3);
        p.delta(1, 1, false, 6, 4);
        assert_eq!(p.step, Some(pb::StreamResume { turn: 1, step: 1, text_offset: 10, reasoning_offset: 3 }));
        p.event(&EventPayload::StepStart { turn: 1, step: 2 });
        assert!(p.step.is_some(), "another event leaves it");
        p.event(&EventPayload::StepEnd { turn: 1, step: 1, spent: None });
        assert_eq!(p.step, None);
        p.delta(2, 1, false, 0, 2);
        p.event(&EventPayload::StepEnd { turn: 1, step: 2, spent: None });
        assert!(p.step.is_some(), "the end of another step leaves it");
    }
}
