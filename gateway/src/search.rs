//! `ListSessions` with filters and orders (SPEC §16), served from the session index
//! (`turnstile_journal::index`, decision 0069) instead of each session's log.
//!
//! A page token is the position after the page's last session in its order: `tenant/id` by id,
//! `@<last_activity_ms>:tenant/id` by last activity. It stays valid while sessions change: the next page
//! starts after that position, wherever the sessions are now (one that moved ahead may be missed, one that
//! moved behind seen again, as with any keyset page).

use tonic::Status;
use turnstile_journal::index::{Cursor, IndexEntry, Order, Query};
use turnstile_model::labels::Selector;
use turnstile_model::{SessionRef, SessionSummary};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

use crate::service::{Gateway, page_token, parse_page_token};
use crate::{read, status};

/// The filters of a request as an index query (the tenant, cursor and limit are the caller's to set).
pub(crate) fn query_of(req: &pb::ListSessionsRequest) -> Result<Query, Status> {
    let status = match pb::SessionStatus::try_from(req.status) {
        Ok(pb::SessionStatus::Unspecified) => None,
        Ok(_) => Some(codec::decode_status(req.status).map_err(status::from_convert)?),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "status: {} is not a status; use SESSION_STATUS_IDLE, SESSION_STATUS_RUNNING or leave it unspecified",
                req.status
            )));
        }
    };
    let order = match pb::SessionOrder::try_from(req.order_by) {
        Ok(pb::SessionOrder::Unspecified | pb::SessionOrder::Id) => Order::Id,
        Ok(pb::SessionOrder::LastActivity) => Order::LastActivity,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "order_by: {} is not an order; use SESSION_ORDER_ID or SESSION_ORDER_LAST_ACTIVITY",
                req.order_by
            )));
        }
    };
    let selector = Selector::parse(&req.label_selector).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if let (Some(after), Some(before)) = (req.updated_after_unix_ms, req.updated_before_unix_ms)
        && after >= before
    {
        return Err(Status::invalid_argument(format!(
            "updated_after_unix_ms {after} is not before updated_before_unix_ms {before}; no session could match"
        )));
    }
    Ok(Query {
        status,
        agent: (!req.agent.is_empty()).then(|| req.agent.clone()),
        agent_version: (req.agent_version > 0).then_some(req.agent_version),
        selector,
        updated_after_ms: req.updated_after_unix_ms,
        updated_before_ms: req.updated_before_unix_ms,
        order,
        ..Query::default()
    })
}

/// The page token after `entry` in `order`.
fn token_of(entry: &IndexEntry, order: Order) -> String {
    match order {
        Order::Id => page_token(&entry.session),
        Order::LastActivity => format!("@{}:{}", entry.summary.last_time_ms, page_token(&entry.session)),
    }
}

fn cursor_of(token: &str, order: Order) -> Result<Option<Cursor>, Status> {
    let bad = || {
        Status::invalid_argument(format!(
            "page_token {token:?} is not a token of this order; pass the next_page_token of the previous reply \
             (with the same order_by), or empty to start"
        ))
    };
    match (order, token.strip_prefix('@')) {
        (_, None) if token.is_empty() => Ok(None),
        (Order::Id, None) => Ok(parse_page_token(token)?.map(Cursor::Id)),
        (Order::LastActivity, Some(rest)) => {
            let (ms, session) = rest.split_once(':').ok_or_else(bad)?;
            let ms: u64 = ms.parse().map_err(|_| bad())?;
            let session = parse_page_token(session).map_err(|_| bad())?.ok_or_else(bad)?;
            Ok(Some(Cursor::Activity(ms, session)))
        }
        _ => Err(bad()),
    }
}

impl Gateway {
    /// A page of `query` (its tenant set) after `token`: from the index, or without one by reading the logs
    /// in id order.
    pub(crate) async fn search(
        &self,
        mut query: Query,
        token: &str,
        page_size: usize,
    ) -> Result<pb::ListSessionsReply, Status> {
        query.after = cursor_of(token, query.order)?;
        // One extra tells whether another page exists without an empty last page.
        query.limit = page_size + 1;
        let Some(index) = &self.index else { return self.search_logs(query, page_size).await };
        let mut entries = index.query(&query);
        let more = entries.len() > page_size;
        entries.truncate(page_size);
        let mut sessions = Vec::with_capacity(entries.len());
        for entry in &entries {
            let owner = self.router.owner(&entry.session).await.unwrap_or_default();
            let summary = SessionSummary { owner, ..entry.summary.clone() };
            sessions.push(codec::encode_session_info(&entry.session, &summary));
        }
        let next_page_token = match entries.last() {
            Some(last) if more => token_of(last, query.order),
            _ => String::new(),
        };
        Ok(pb::ListSessionsReply { sessions, next_page_token })
    }

    /// Without an index (a gateway built without one, as in some tests): the logs in id order, each folded
    /// and filtered.
    async fn search_logs(&self, query: Query, page_size: usize) -> Result<pb::ListSessionsReply, Status> {
        if query.order != Order::Id {
            return Err(Status::failed_precondition(
                "this gateway has no session index, so it lists by id only; leave order_by unspecified",
            ));
        }
        let mut after = match query.after.clone() {
            Some(Cursor::Id(s)) => Some(s),
            _ => None,
        };
        let mut found: Vec<pb::SessionInfo> = Vec::new();
        let mut last_seen: Option<SessionRef> = None;
        'pages: while found.len() <= page_size {
            let refs = self
                .log
                .list_sessions(query.tenant.as_deref(), after.as_ref(), page_size + 1)
                .await
                .map_err(status::from_journal)?;
            let Some(last) = refs.last().cloned() else { break };
            for session in refs {
                let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
                let agent = state.agent.clone().unwrap_or_else(|| self.config.default_agent.clone());
                let entry = IndexEntry::of(&state, SessionSummary::of(&state, String::new(), agent));
                if query.matches(&entry) {
                    if found.len() == page_size {
                        // Another match exists: this page ends at the one before.
                        found.push(pb::SessionInfo::default());
                        break 'pages;
                    }
                    found.push(self.info(&state).await);
                    last_seen = Some(session);
                }
            }
            after = Some(last);
        }
        let more = found.len() > page_size;
        found.truncate(page_size);
        let next_page_token = match last_seen {
            Some(last) if more => page_token(&last),
            _ => String::new(),
        };
        Ok(pb::ListSessionsReply { sessions: found, next_page_token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_in_their_order_and_bad_ones_say_what_to_pass() {
        let state = turnstile_model::SessionState::new(SessionRef::new("acme", "s1").unwrap(), 10);
        let mut summary = SessionSummary::of(&state, String::new(), "scripted".into());
        summary.last_time_ms = 42;
        let entry = IndexEntry::of(&state, summary);
        let token = token_of(&entry, Order::LastActivity);
        assert_eq!(token, "@42:acme/s1");
        assert_eq!(cursor_of(&token, Order::LastActivity).unwrap(), Some(Cursor::Activity(42, entry.session.clone())));
        assert_eq!(cursor_of("acme/s1", Order::Id).unwrap(), Some(Cursor::Id(entry.session.clone())));
        let err = cursor_of(&token, Order::Id).unwrap_err();
        assert!(err.message().contains("same order_by"), "{}", err.message());
        let req = pb::ListSessionsRequest { label_selector: "Team=x".into(), ..Default::default() };
        let err = query_of(&req).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("label_selector item \"Team=x\""), "{}", err.message());
    }
}
