//! The session index (SPEC §16): what `ListSessions` filters and orders without reading every session's log.
//!
//! One [`IndexEntry`] per session: the summary readers report (status, agent, parent, labels, last activity,
//! …) and how many schedules it has. The session's owner submits an entry after each input that changed it
//! ([`SessionIndex::submit`], never waiting: the log is the truth, the index follows it); readers query an
//! in-memory [`MemoryIndex`]. In `turnstile dev` on the embedded journal that memory *is* the index; on
//! JetStream ([`crate::jetstream::KvIndex`]) the entries live in the KV bucket `turnstile_index` and every
//! node keeps a mirror of it through a KV watch (docs/decisions/0069-session-index.md).
//!
//! ```
//! use turnstile_journal::index::{IndexEntry, MemoryIndex, Order, Query, SessionIndex};
//! use turnstile_model::{SessionRef, SessionState, SessionSummary};
//! let index = MemoryIndex::default();
//! let state = SessionState::new(SessionRef::new("acme", "s1").unwrap(), 10);
//! index.submit(IndexEntry::of(&state, SessionSummary::of(&state, String::new(), "scripted".into())));
//! let page = index.query(&Query { tenant: Some("acme".into()), ..Query::default() });
//! assert_eq!(page.len(), 1);
//! ```

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};
use turnstile_model::labels::Selector;
use turnstile_model::{SessionRef, SessionState, SessionSummary, Status};

/// What the index knows of one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub session: SessionRef,
    /// As readers report it; `owner` is left empty (the shard map knows it).
    pub summary: SessionSummary,
    /// How many schedules the session has (`ListSchedules` without a session visits those with some).
    #[serde(default)]
    pub schedules: u32,
}

impl IndexEntry {
    /// The entry of the fold `state` whose summary is `summary`.
    pub fn of(state: &SessionState, mut summary: SessionSummary) -> Self {
        summary.owner.clear();
        Self { session: state.session.clone(), summary, schedules: state.schedules.len() as u32 }
    }

    /// The same entry but for the session's progress: its activity (`last_seq`, `last_time_ms`) and its
    /// last turn, which moves with every followup. No filter of a query reads them and only the order by
    /// last activity does: the KV index's writer may hold such a change back for a while (decision 0198).
    pub fn same_but_progress(&self, other: &IndexEntry) -> bool {
        self.same_but(other, false)
    }

    /// The same entry but for what changes on every event: an owner compares with this to submit only
    /// what a query could see differently.
    pub fn same_but_activity(&self, other: &IndexEntry) -> bool {
        self.same_but(other, true)
    }

    /// Equal but for activity; with `turn`, the last turn must be equal too.
    fn same_but(&self, other: &IndexEntry, turn: bool) -> bool {
        // Field by field, without copying either entry (this runs after every input of a session); the
        // destructuring names every field, so a new one cannot be forgotten here.
        let SessionSummary {
            status,
            last_seq: _,
            last_turn,
            epoch,
            owner,
            agent,
            inject_mode,
            agent_version,
            goal,
            last_time_ms: _,
            parent,
            labels,
        } = &self.summary;
        let o = &other.summary;
        self.session == other.session
            && self.schedules == other.schedules
            && *status == o.status
            && (!turn || *last_turn == o.last_turn)
            && *epoch == o.epoch
            && *owner == o.owner
            && *agent == o.agent
            && *inject_mode == o.inject_mode
            && *agent_version == o.agent_version
            && *goal == o.goal
            && *parent == o.parent
            && *labels == o.labels
    }
}

/// How a page is ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// By tenant, then session id.
    #[default]
    Id,
    /// Newest last activity first, then by id.
    LastActivity,
}

/// Where the previous page ended (the page token's content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    Id(SessionRef),
    Activity(u64, SessionRef),
}

/// A `ListSessions` page request against the index.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// `None`: every tenant (an operator without auth).
    pub tenant: Option<String>,
    pub status: Option<Status>,
    pub agent: Option<String>,
    /// Only sessions that recorded this version of their agent (SPEC §20).
    pub agent_version: Option<u64>,
    pub parent: Option<SessionRef>,
    pub selector: Selector,
    pub updated_after_ms: Option<u64>,
    pub updated_before_ms: Option<u64>,
    /// Only sessions with at least one schedule.
    pub with_schedules: bool,
    pub order: Order,
    pub after: Option<Cursor>,
    /// At most this many entries (0: no limit).
    pub limit: usize,
}

impl Query {
    /// Whether `entry` passes every filter (not the tenant, the cursor or the limit).
    pub fn matches(&self, entry: &IndexEntry) -> bool {
        let s = &entry.summary;
        self.status.is_none_or(|status| s.status == status)
            && self.agent.as_ref().is_none_or(|agent| &s.agent == agent)
            && self.agent_version.is_none_or(|v| s.agent_version == Some(v))
            && self.parent.as_ref().is_none_or(|parent| s.parent.as_ref() == Some(parent))
            && self.updated_after_ms.is_none_or(|t| s.last_time_ms > t)
            && self.updated_before_ms.is_none_or(|t| s.last_time_ms < t)
            && (!self.with_schedules || entry.schedules > 0)
            && self.selector.matches(&s.labels)
    }
}

/// The index a node reads and a session's owner writes.
pub trait SessionIndex: Send + Sync + 'static {
    /// Records `entry` (replacing the session's last one). Returns at once; the store is written behind.
    fn submit(&self, entry: IndexEntry);
    /// Forgets a deleted session.
    fn remove(&self, session: &SessionRef);
    /// The session's entry as this node sees it.
    fn get(&self, session: &SessionRef) -> Option<IndexEntry>;
    /// A page of the entries `query` selects, in its order, after its cursor.
    fn query(&self, query: &Query) -> Vec<IndexEntry>;
    /// Whether this node's view has caught up with the store since it started (a mirror still loading
    /// would make a new owner re-submit what is already there).
    fn is_loaded(&self) -> bool {
        true
    }
    /// [`SessionIndex::is_loaded`] as a watch, so a caller waits for it instead of polling (default: loaded
    /// from the start). A sender that goes away means the view will not catch up further.
    fn loaded(&self) -> tokio::sync::watch::Receiver<bool> {
        tokio::sync::watch::channel(true).1
    }
    /// Resolves once everything submitted before the call is in the store (or was tried once and queued
    /// again): a store written behind in batches is flushed before a shard is handed over and when the
    /// process stops, so the next owner reads what this one knew. Default: nothing is held back.
    fn flush(&self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

#[derive(Default)]
struct TenantTable {
    by_id: BTreeMap<String, IndexEntry>,
    by_activity: BTreeSet<(Reverse<u64>, String)>,
}

/// The in-memory index: per tenant, entries by id and by last activity, so a page is a walk from the
/// cursor that stops once it is full.
#[derive(Default)]
pub struct MemoryIndex {
    tenants: RwLock<HashMap<String, TenantTable>>,
}

impl std::fmt::Debug for MemoryIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryIndex").field("sessions", &self.len()).finish()
    }
}

impl MemoryIndex {
    pub fn len(&self) -> usize {
        crate::sync::read(&self.tenants).values().map(|t| t.by_id.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `entry` unless the index holds a later one of the same session (a mirror may see its own
    /// submissions before the store's echo of older ones).
    pub fn apply(&self, entry: IndexEntry) {
        self.swap(entry);
    }

    /// [`MemoryIndex::apply`], returning the entry `entry` replaced (`None` when there was none, or when
    /// `entry` was refused as older). The KV index's writer compares a session's next write with it: it is
    /// what the bucket holds when nothing of the session waits to be written (decision 0198).
    pub fn swap(&self, entry: IndexEntry) -> Option<IndexEntry> {
        let mut tenants = crate::sync::write(&self.tenants);
        let table = tenants.entry(entry.session.tenant.clone()).or_default();
        let id = entry.session.id.clone();
        if let Some(old) = table.by_id.get(&id) {
            if old.summary.last_seq > entry.summary.last_seq {
                return None;
            }
            table.by_activity.remove(&(Reverse(old.summary.last_time_ms), id.clone()));
        }
        table.by_activity.insert((Reverse(entry.summary.last_time_ms), id.clone()));
        table.by_id.insert(id, entry)
    }

    pub fn forget(&self, session: &SessionRef) {
        let mut tenants = crate::sync::write(&self.tenants);
        if let Some(table) = tenants.get_mut(&session.tenant)
            && let Some(old) = table.by_id.remove(&session.id)
        {
            table.by_activity.remove(&(Reverse(old.summary.last_time_ms), session.id.clone()));
        }
    }

    /// Appends to `out` the matches of `tenant`'s table after the query's cursor (when the cursor is in
    /// this tenant), up to `limit` in all.
    fn page_of(tenant: &str, table: &TenantTable, query: &Query, out: &mut Vec<IndexEntry>, limit: usize) {
        match query.order {
            Order::Id => {
                let start = match &query.after {
                    Some(Cursor::Id(after)) if after.tenant == tenant => std::ops::Bound::Excluded(after.id.clone()),
                    _ => std::ops::Bound::Unbounded,
                };
                for entry in table.by_id.range((start, std::ops::Bound::Unbounded)).map(|(_, e)| e) {
                    if out.len() >= limit {
                        return;
                    }
                    if query.matches(entry) {
                        out.push(entry.clone());
                    }
                }
            }
            Order::LastActivity => {
                let start = match &query.after {
                    Some(Cursor::Activity(ms, after)) if after.tenant == tenant => {
                        std::ops::Bound::Excluded((Reverse(*ms), after.id.clone()))
                    }
                    _ => std::ops::Bound::Unbounded,
                };
                for (_, id) in table.by_activity.range((start, std::ops::Bound::Unbounded)) {
                    if out.len() >= limit {
                        return;
                    }
                    if let Some(entry) = table.by_id.get(id)
                        && query.matches(entry)
                    {
                        out.push(entry.clone());
                    }
                }
            }
        }
    }
}

impl SessionIndex for MemoryIndex {
    fn submit(&self, entry: IndexEntry) {
        self.apply(entry);
    }

    fn remove(&self, session: &SessionRef) {
        self.forget(session);
    }

    fn get(&self, session: &SessionRef) -> Option<IndexEntry> {
        crate::sync::read(&self.tenants).get(&session.tenant).and_then(|t| t.by_id.get(&session.id)).cloned()
    }

    fn query(&self, query: &Query) -> Vec<IndexEntry> {
        let limit = if query.limit == 0 { usize::MAX } else { query.limit };
        let tenants = crate::sync::read(&self.tenants);
        let mut out = Vec::new();
        match &query.tenant {
            Some(tenant) => {
                if let Some(table) = tenants.get(tenant) {
                    Self::page_of(tenant, table, query, &mut out, limit);
                }
            }
            None => {
                // Every tenant (no auth): tenants in name order, each from the cursor's position on.
                let mut names: Vec<&String> = tenants.keys().collect();
                names.sort();
                let after_tenant = match &query.after {
                    Some(Cursor::Id(s) | Cursor::Activity(_, s)) => Some(s.tenant.clone()),
                    None => None,
                };
                for name in names {
                    if after_tenant.as_ref().is_some_and(|t| name < t) {
                        continue;
                    }
                    let mut q = query.clone();
                    if after_tenant.as_ref() != Some(name) {
                        q.after = None;
                    }
                    Self::page_of(name, &tenants[name], &q, &mut out, limit);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tenant: &str, id: &str, last_ms: u64, labels: &[(&str, &str)]) -> IndexEntry {
        let state = SessionState::new(SessionRef::new(tenant, id).unwrap(), 10);
        let mut summary = SessionSummary::of(&state, String::new(), "scripted".into());
        summary.last_time_ms = last_ms;
        summary.last_seq = last_ms;
        summary.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        IndexEntry::of(&state, summary)
    }

    fn ids(entries: &[IndexEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.session.id.as_str()).collect()
    }

    #[test]
    fn progress_is_activity_and_the_last_turn() {
        let idle = entry("acme", "a", 100, &[("team", "blue")]);
        let mut next = entry("acme", "a", 200, &[("team", "blue")]);
        next.summary.last_turn += 1;
        assert!(next.same_but_progress(&idle), "a followup later, idle again");
        assert!(!next.same_but_activity(&idle), "the runner still submits a new turn");
        next.summary.status = Status::Running;
        assert!(!next.same_but_progress(&idle), "a status is seen by queries");
        let relabeled = entry("acme", "a", 200, &[("team", "red")]);
        assert!(!relabeled.same_but_progress(&idle));
    }

    #[test]
    fn pages_filter_order_and_go_on_from_their_cursor() {
        let index = MemoryIndex::default();
        for (i, id) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let team = if i % 2 == 0 { "blue" } else { "red" };
            index.submit(entry("acme", id, 100 + i as u64, &[("team", team)]));
        }
        index.submit(entry("other", "z", 1_000, &[("team", "blue")]));
        let blue = Query {
            tenant: Some("acme".into()),
            selector: Selector::parse("team=blue").unwrap(),
            limit: 2,
            ..Query::default()
        };
        let first = index.query(&blue);
        assert_eq!(ids(&first), ["a", "c"]);
        let next = Query { after: Some(Cursor::Id(first[1].session.clone())), ..blue.clone() };
        assert_eq!(ids(&index.query(&next)), ["e"]);
        let recent = Query { order: Order::LastActivity, ..blue.clone() };
        let first = index.query(&recent);
        assert_eq!(ids(&first), ["e", "c"]);
        let last = &first[1];
        let next = Query { after: Some(Cursor::Activity(last.summary.last_time_ms, last.session.clone())), ..recent };
        assert_eq!(ids(&index.query(&next)), ["a"]);
        // A session whose activity moves is found at its new place, once.
        index.submit(entry("acme", "a", 500, &[("team", "blue")]));
        let all = Query { tenant: Some("acme".into()), order: Order::LastActivity, ..Query::default() };
        assert_eq!(ids(&index.query(&all)), ["a", "e", "d", "c", "b"]);
        // An older entry of a session does not replace a newer one.
        index.submit(entry("acme", "a", 10, &[]));
        assert_eq!(index.get(&SessionRef::new("acme", "a").unwrap()).unwrap().summary.last_time_ms, 500);
        assert_eq!(ids(&index.query(&Query { tenant: None, ..Query::default() })), ["a", "b", "c", "d", "e", "z"]);
        index.remove(&SessionRef::new("acme", "a").unwrap());
        assert_eq!(index.query(&Query { tenant: Some("acme".into()), ..Query::default() }).len(), 4);
    }
}
