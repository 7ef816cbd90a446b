//! `ExportSessions` and `ImportSessions` (SPEC §18, decision 0074): a tenant's sessions out of one cluster
//! and into another, every seq, time, epoch and MessageId kept.
//!
//! An export is a stream of [`pb::ExportItem`]s: a header, then each session's log from seq 1 as groups of
//! events, each session closed by its `end`. The gateway reads the logs itself (as it does for Watch); an
//! import sends each group to the session's owner as [`Command::Import`], so the single writer of every
//! session stays its owner (the host appends the group and holds the session until its last one). The
//! events cross both ways in the codec's form, so a `Watch` of an imported session streams the same bytes
//! as one of the original.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};
use turnstile_journal::SessionLog;
use turnstile_model::{Command, CommandReply, Envelope, SessionRef};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::export_item::Item;

use crate::service::{Gateway, unexpected};
use crate::{read, status};

/// The export format this build writes in [`pb::ExportHeader::format`] and the newest it imports.
pub const EXPORT_FORMAT: u32 = 1;
/// An exported group holds at most this many events…
const GROUP_EVENTS: usize = 256;
/// …and, past its first event, at most this many encoded bytes (well under the request limit of the
/// gateway→worker hop, which carries one group).
const GROUP_BYTES: usize = 1 << 20;
/// Sessions listed per page when a whole tenant is exported.
const LIST_PAGE: usize = 256;
/// Events read per page of a session's log.
const READ_PAGE: usize = 1024;

type Items = mpsc::Sender<Result<pb::ExportItem, Status>>;

impl Gateway {
    /// `ExportSessions`: checks the caller and the request, then streams the export from a task.
    pub(crate) async fn export(
        &self,
        request: Request<pb::ExportSessionsRequest>,
    ) -> Result<ReceiverStream<Result<pb::ExportItem, Status>>, Status> {
        // An admin's own tenant; any tenant for a cluster admin (`scope.rs`).
        let (scope, req) = self.open(request).await?;
        let tenant = scope.tenant.into_string();
        let sessions = req
            .sessions
            .into_iter()
            .map(|id| {
                SessionRef::new(tenant.clone(), id.clone())
                    .map_err(|e| Status::invalid_argument(format!("sessions: {id:?} is not a session id: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (tx, rx) = mpsc::channel(4);
        let log = self.log.clone();
        // A whole tenant's export carries its memory too (SPEC §20); a list of sessions does not.
        let memory = if sessions.is_empty() { self.memory.clone() } else { None };
        tokio::spawn(async move {
            let exported = match export_tenant(log.as_ref(), &tenant, sessions, &tx).await {
                Ok(()) => match memory {
                    Some(memory) => export_memory(memory.as_ref(), &tenant, &tx).await,
                    None => Ok(()),
                },
                Err(status) => Err(status),
            };
            if let Err(status) = exported {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    /// `ImportSessions`: writes each session's groups through its owner, in order; answers the counts.
    pub(crate) async fn import(&self, request: Request<Streaming<pb::ExportItem>>) -> Result<pb::ImportReply, Status> {
        let caller = self.caller(request.metadata(), <pb::ExportHeader as crate::scope::Scoped>::ROLE)?;
        let mut stream = request.into_inner();
        let mut header = match stream.message().await?.and_then(|i| i.item) {
            Some(Item::Header(h)) => h,
            _ => return Err(Status::invalid_argument("not an export: its first item must be the header")),
        };
        if header.format > EXPORT_FORMAT {
            return Err(Status::invalid_argument(format!(
                "the export is in format {}, newer than this server reads ({EXPORT_FORMAT}): import it into a \
                 cluster of the version that exported it, or a newer one",
                header.format
            )));
        }
        // Into an admin's own tenant only; any tenant for a cluster admin (`scope.rs`).
        let scope = self.confine(caller, &mut header).await?;
        let mut import = Import {
            gateway: self,
            tenant: scope.tenant.into_string(),
            pending: None,
            reply: pb::ImportReply::default(),
        };
        while let Some(item) = stream.message().await? {
            match item.item {
                Some(Item::Events(group)) => import.group(group).await?,
                Some(Item::End(end)) => import.end(end).await?,
                Some(Item::Memory(document)) => import.memory(document).await?,
                Some(Item::Header(_)) => return Err(Status::invalid_argument("the export has a second header")),
                None => return Err(Status::invalid_argument("the export has an item with nothing set")),
            }
        }
        if let Some((session, events)) = import.pending {
            return Err(truncated(&session, events.last().map_or(0, |e| e.seq)));
        }
        Ok(import.reply)
    }
}

/// Streams the header and then every session of `tenant` (or the listed ones) into `tx`.
async fn export_tenant(
    log: &dyn SessionLog,
    tenant: &str,
    sessions: Vec<SessionRef>,
    tx: &Items,
) -> Result<(), Status> {
    let exported_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let header = pb::ExportHeader { format: EXPORT_FORMAT, tenant: tenant.to_owned(), exported_unix_ms };
    send(tx, Item::Header(header)).await?;
    if !sessions.is_empty() {
        for session in &sessions {
            export_session(log, session, tx).await?;
        }
        return Ok(());
    }
    let mut after = None;
    loop {
        let page = log.list_sessions(Some(tenant), after.as_ref(), LIST_PAGE).await.map_err(status::from_journal)?;
        for session in &page {
            export_session(log, session, tx).await?;
        }
        match page.last() {
            Some(last) if page.len() == LIST_PAGE => after = Some(last.clone()),
            _ => return Ok(()),
        }
    }
}

/// Every memory document of `tenant`, one item each, in (namespace, key) order.
async fn export_memory(memory: &dyn turnstile_journal::MemoryStore, tenant: &str, tx: &Items) -> Result<(), Status> {
    let mut query = turnstile_journal::memory::ListQuery { limit: LIST_PAGE, ..Default::default() };
    loop {
        let page = memory.list(tenant, &query).await.map_err(crate::memory::from_memory)?;
        for document in page.documents {
            send(tx, Item::Memory(crate::memory::encode(document))).await?;
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(()),
        }
    }
}

/// One session's log from seq 1 as groups, then its `end`. NOT_FOUND for a session without events.
async fn export_session(log: &dyn SessionLog, session: &SessionRef, tx: &Items) -> Result<(), Status> {
    let mut next = 1;
    loop {
        let page = log.read(session, next, READ_PAGE).await.map_err(status::from_journal)?;
        let Some(last) = page.last() else { break };
        next = last.seq + 1;
        for group in groups(&page) {
            send(tx, Item::Events(pb::SessionEventGroup { events: group })).await?;
        }
        if page.len() < READ_PAGE {
            break;
        }
    }
    if next == 1 {
        return Err(read::not_found(session));
    }
    let end = pb::ExportedSession { session: Some(codec::encode_session_ref(session)), last_seq: next - 1 };
    send(tx, Item::End(end)).await
}

/// `events` encoded, cut into groups of at most [`GROUP_EVENTS`] events and [`GROUP_BYTES`] bytes (a
/// larger event is a group of its own).
fn groups(events: &[Envelope]) -> Vec<Vec<pb::SessionEvent>> {
    let mut out: Vec<Vec<pb::SessionEvent>> = Vec::new();
    let mut bytes = 0;
    for event in events {
        let encoded = codec::encode_session_event(event);
        let size = prost::Message::encoded_len(&encoded);
        match out.last_mut() {
            Some(group) if group.len() < GROUP_EVENTS && bytes + size <= GROUP_BYTES => {
                bytes += size;
                group.push(encoded);
            }
            _ => {
                bytes = size;
                out.push(vec![encoded]);
            }
        }
    }
    out
}

async fn send(tx: &Items, item: Item) -> Result<(), Status> {
    // A client that went away ends the export; there is nobody to tell.
    tx.send(Ok(pb::ExportItem { item: Some(item) })).await.map_err(|_| Status::cancelled("the client went away"))
}

/// An import in progress: the group read last is held until the next item says whether it is its
/// session's last.
struct Import<'a> {
    gateway: &'a Gateway,
    tenant: String,
    pending: Option<(SessionRef, Vec<Envelope>)>,
    reply: pb::ImportReply,
}

impl Import<'_> {
    async fn group(&mut self, group: pb::SessionEventGroup) -> Result<(), Status> {
        let events = group
            .events
            .into_iter()
            .map(|e| codec::decode_session_event(e).map_err(status::from_convert))
            .collect::<Result<Vec<_>, _>>()?;
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Err(Status::invalid_argument("the export has an empty group of events"));
        };
        let session = first.session.clone();
        if session.tenant != self.tenant {
            return Err(Status::invalid_argument(format!(
                "the export is of tenant {:?} but holds session {session}",
                self.tenant
            )));
        }
        if let Some(stray) = events.iter().find(|e| e.session != session) {
            return Err(Status::invalid_argument(format!("a group of {session} holds an event of {}", stray.session)));
        }
        if (last.seq - first.seq).checked_add(1) != Some(events.len() as u64) {
            return Err(Status::invalid_argument(format!("a group of {session} holds seqs that are not contiguous")));
        }
        let follows = match self.pending.take() {
            Some((held, before)) if held == session => {
                let end = before.last().map_or(0, |e| e.seq);
                self.write(&held, before, false).await?;
                end
            }
            Some((held, before)) => return Err(truncated(&held, before.last().map_or(0, |e| e.seq))),
            None => 0,
        };
        if first.seq != follows + 1 {
            return Err(Status::invalid_argument(format!(
                "session {session}'s events go on at seq {} after seq {follows}: an export holds whole logs from seq 1",
                first.seq
            )));
        }
        self.pending = Some((session, events));
        Ok(())
    }

    async fn end(&mut self, end: pb::ExportedSession) -> Result<(), Status> {
        let session = codec::decode_session_ref(end.session.unwrap_or_default()).map_err(status::from_convert)?;
        let Some((held, events)) = self.pending.take().filter(|(held, _)| *held == session) else {
            return Err(Status::invalid_argument(format!("the export closes session {session} without its events")));
        };
        let last = events.last().map_or(0, |e| e.seq);
        if last != end.last_seq {
            return Err(Status::invalid_argument(format!(
                "the export closes session {session} at seq {} but its events end at {last}",
                end.last_seq
            )));
        }
        self.write(&held, events, true).await?;
        self.reply.sessions += 1;
        Ok(())
    }

    /// A memory document, written into the import's tenant (whatever tenant the item names), keeping
    /// when and by whom it was written.
    async fn memory(&mut self, document: pb::MemoryDocument) -> Result<(), Status> {
        let store = self.gateway.memory.as_ref().ok_or_else(|| {
            Status::unimplemented("the export holds memory but this gateway keeps none (no memory store)")
        })?;
        if let Some((held, events)) = &self.pending {
            return Err(truncated(held, events.last().map_or(0, |e| e.seq)));
        }
        let put = turnstile_journal::memory::MemoryPut {
            tenant: self.tenant.clone(),
            namespace: document.namespace,
            key: document.key,
            document: document.document,
            written_by: Some(document.written_by).filter(|w| !w.is_empty()),
            now_ms: document.updated_unix_ms,
        };
        store.put(put).await.map_err(crate::memory::from_memory)?;
        self.reply.memory_documents += 1;
        Ok(())
    }

    /// One group to the session's owner.
    async fn write(&mut self, session: &SessionRef, events: Vec<Envelope>, complete: bool) -> Result<(), Status> {
        let count = events.len() as u64;
        let command = Command::Import { events, complete };
        let done = self.reply.sessions;
        match self.gateway.router.execute(session, command, None).await {
            Ok(CommandReply::Written { .. }) => {
                self.reply.events += count;
                Ok(())
            }
            Ok(other) => Err(unexpected("import", &other)),
            Err(e) => {
                let status = status::from_command(e);
                let message =
                    format!("importing session {session} ({done} sessions imported before it): {}", status.message());
                Err(Status::with_metadata(status.code(), message, status.metadata().clone()))
            }
        }
    }
}

fn truncated(session: &SessionRef, last: u64) -> Status {
    Status::invalid_argument(format!(
        "the export ends session {session} at seq {last} without its `end` item: it is truncated; session {session} \
         is partly imported, delete it (DeleteSession) before importing it again"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_model::{EventPayload, Status as SessionStatus};

    #[test]
    fn groups_are_bounded_in_events_and_bytes() {
        let session = SessionRef::new("acme", "s").unwrap();
        let event = |seq: u64, text: usize| Envelope {
            session: session.clone(),
            seq,
            time_ms: seq,
            epoch: 1,
            payload: if text == 0 {
                EventPayload::Status(if seq % 2 == 1 { SessionStatus::Running } else { SessionStatus::Idle })
            } else {
                EventPayload::ToolResult {
                    turn: 1,
                    step: 1,
                    call_id: "c".into(),
                    output: "x".repeat(text),
                    error: None,
                }
            },
        };
        let small: Vec<Envelope> = (1..=600).map(|s| event(s, 0)).collect();
        let sizes: Vec<usize> = groups(&small).iter().map(Vec::len).collect();
        assert_eq!(sizes, [256, 256, 88]);
        let large: Vec<Envelope> = (1..=3).map(|s| event(s, 700 * 1024)).collect();
        assert_eq!(groups(&large).iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1], "one large event a group");
        let seqs: Vec<u64> = groups(&small).concat().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=600).collect::<Vec<_>>(), "in order, none lost");
    }
}
