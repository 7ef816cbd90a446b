//! A [`SessionLog`] for host tests: an [`EmbeddedLog`] that keeps every event ever appended (the log
//! itself may be deleted) and can hold appends until the test lets them through.
#![allow(dead_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use tokio::sync::Semaphore;
use turnstile_journal::{EmbeddedLog, EventStream, JournalError, SessionLog};
use turnstile_model::{Envelope, SessionRef};

pub struct TestLog {
    inner: EmbeddedLog,
    /// Every event appended, in order, even after a delete.
    pub appended: Mutex<Vec<Envelope>>,
    /// When set, each append takes a permit first ([`TestLog::gated`]).
    permits: Option<Semaphore>,
    /// Appends waiting for a permit.
    waiting: AtomicUsize,
    /// Each `append_first`, in order: whether it wrote.
    pub first_appends: Mutex<Vec<bool>>,
}

impl TestLog {
    /// Appends go through at once.
    pub fn recording() -> Self {
        Self {
            inner: EmbeddedLog::in_memory(),
            appended: Mutex::default(),
            permits: None,
            waiting: AtomicUsize::new(0),
            first_appends: Mutex::default(),
        }
    }

    /// Appends wait until [`TestLog::release`].
    pub fn gated() -> Self {
        Self { permits: Some(Semaphore::new(0)), ..Self::recording() }
    }

    /// Lets every waiting and later append through.
    pub fn release(&self) {
        if let Some(permits) = &self.permits {
            permits.add_permits(Semaphore::MAX_PERMITS / 2);
        }
    }

    /// Appends waiting for [`TestLog::release`].
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl SessionLog for TestLog {
    async fn append(
        &self,
        session: &SessionRef,
        expected: u64,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        if let Some(permits) = &self.permits {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            permits.acquire().await.unwrap().forget();
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        let last = self.inner.append(session, expected, events, traceparent).await?;
        self.appended.lock().unwrap().extend_from_slice(events);
        Ok(last)
    }
    async fn append_first(
        &self,
        session: &SessionRef,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        let written = match self.append(session, 0, events, traceparent).await {
            Err(JournalError::Conflict { .. }) => Err(JournalError::FirstRefused { session: session.clone() }),
            other => other,
        };
        self.first_appends.lock().unwrap().push(written.is_ok());
        written
    }
    async fn read(&self, session: &SessionRef, from_seq: u64, limit: usize) -> Result<Vec<Envelope>, JournalError> {
        self.inner.read(session, from_seq, limit).await
    }
    async fn last_seq(&self, session: &SessionRef) -> Result<u64, JournalError> {
        self.inner.last_seq(session).await
    }
    async fn tail(&self, session: &SessionRef, after_seq: u64) -> Result<EventStream, JournalError> {
        self.inner.tail(session, after_seq).await
    }
    async fn delete(&self, session: &SessionRef) -> Result<u64, JournalError> {
        self.inner.delete(session).await
    }
    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<&SessionRef>,
        limit: usize,
    ) -> Result<Vec<SessionRef>, JournalError> {
        self.inner.list_sessions(tenant, after, limit).await
    }
}
