//! The conformance suite and the property-based model test every backend runs (feature
//! `testkit`).
//!
//! A backend provides an async factory that returns a fresh, empty [`Subject`] and stamps the
//! tests with two macros:
//!
//! ```text
//! async fn subject() -> awareness_core::testkit::Subject { /* a fresh store */ }
//! awareness_core::conformance_suite!(subject, foreign_commits: Uncounted);
//! awareness_core::model_test!(subject);
//! ```
//!
//! The stamping states what the store's `foreign_commits` answers ([`ForeignCommits`]), as the
//! stampings of the durable and read-only suites do too.
//!
//! Each check is a plain async function in [`checks`] taking a `&Subject`, so a new behaviour is
//! one new function (and one new name in the macro) that every backend then runs.
//!
//! Stores that batch concurrent recordings into shared write transactions (the durable ones)
//! also stamp [`group_commit_suite!`](crate::group_commit_suite), the checks of
//! [`group_commit`].
//!
//! Stores that keep their state in a file also stamp [`durable_suite!`](crate::durable_suite),
//! the checks of [`durable`]: reopening, two handles on one file, a cancelled write, a cancelled
//! acknowledgement or re-freeze, a cancelled pruning pass, and rows that can no longer be read; and
//! [`open_suite!`](crate::open_suite), the checks of [`open`]: what a read-write open refuses
//! and leaves untouched (a directory, a missing directory, a file that is not a store, a
//! truncated one), an empty file becoming a new store, two opens of a new file at once, an open
//! cancelled at any moment, and (on Unix) new files private to their owner, and, in a test
//! target of their own, [`permission_suite!`](crate::permission_suite): an open by a user who
//! may not write the directory or the file, or read the file. Those that can open a file read-only
//! stamp [`read_only_suite!`](crate::read_only_suite), the checks of [`read_only`].

use std::any::Any;
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use crate::error::StoreError;
use crate::model::{CursorFilter, Sequence, SessionKey, SessionRef, WatcherKey};
use crate::store::AwarenessStore;
use crate::upstream::UpstreamStore;

pub mod checks;
pub mod durable;
pub mod failing;
pub mod group_commit;
pub mod hooked;
pub mod logs;
pub mod model;
pub mod open;
pub mod pause;
#[cfg(unix)]
pub mod process;
pub mod read_only;

pub use proptest;

/// Direct access to a backend's rows, bypassing the protocol, as an operator editing the file by
/// hand would. Used to prove that a store never infers state from row arithmetic.
///
/// The durable suite's checks assert that a helper found and changed its row (`true`). A
/// `spoil_*_text` helper that must answer `false` (the store cannot hold such text there)
/// means the store stamps `durable_suite!(open, foreign_commits: ..., text_in_every_row: false)`,
/// which leaves out the cursor and head checks that need it (no durable store of this
/// workspace does: store-redb, which did, reads those rows as bytes since stop 47).
#[async_trait]
pub trait RawAccess: Send + Sync {
    /// Deletes one event row by sequence, touching nothing else (no watermark, no head).
    async fn delete_event_row(&self, sequence: Sequence) -> Result<(), StoreError>;
    /// Deletes one session's head row, touching nothing else (its events and the cursors on it
    /// stay), as a hand edit or another application's writer could leave a file.
    async fn delete_head_row(&self, session: &SessionRef) -> Result<(), StoreError>;
    /// Overwrites one event row so that the store can no longer read it, as a torn write or a
    /// hand edit could leave it, touching nothing else (its dedupe key stays taken, its head
    /// stays). Returns whether the store could: `false` from a store that keeps values rather
    /// than bytes (store-memory), which does not run the checks that need it (the durable
    /// suite's).
    async fn damage_event_row(&self, sequence: Sequence) -> Result<bool, StoreError>;
    /// Overwrites one cursor row so that the store can no longer read it (its target agent
    /// becomes empty, which no key may be), as a torn write or a hand edit could leave it,
    /// touching nothing else (its sequences, its place in every index). Returns whether the
    /// row existed; `false` from a store that keeps values rather than bytes (store-memory).
    async fn damage_cursor_row(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError>;
    /// Overwrites the upstream link row of `session` so that the store can no longer read it
    /// as a link (text that is not JSON where JSON is kept: the marker's column, or the whole
    /// value of a store that keeps a link as one JSON value), as a torn write or a hand edit
    /// could leave it. Returns whether the row existed; `false` from a store that keeps values rather than
    /// bytes (store-memory).
    async fn damage_link_row(&self, session: &SessionRef) -> Result<bool, StoreError>;
    /// Overwrites the thread id of the upstream link row of `session` with bytes that are not
    /// UTF-8 (a hand edit by a tool that does not check), touching nothing else. Returns
    /// whether the row existed; `false` from a store that keeps values rather than bytes
    /// (store-memory).
    async fn spoil_link_text(&self, session: &SessionRef) -> Result<bool, StoreError>;
    /// Overwrites the session key of the upstream link row of `session` with bytes that are not
    /// UTF-8 (so the row no longer answers to `session`), touching nothing else. Returns whether
    /// the row existed; `false` from a store that cannot hold such text there (store-memory
    /// keeps values).
    async fn spoil_link_key(&self, session: &SessionRef) -> Result<bool, StoreError>;
    /// Overwrites the target agent of the cursor row `(watcher, target)` with bytes that are
    /// not UTF-8, touching nothing else. Returns whether the row existed; `false` from a store
    /// that cannot hold such text there (store-memory keeps values).
    async fn spoil_cursor_text(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError>;
    /// Overwrites the watcher key of the cursor row `(watcher, target)` with bytes that are not
    /// UTF-8 (so the row no longer answers to `watcher`), touching nothing else. Returns
    /// whether the row existed; `false` from a store that cannot hold such text there, as for
    /// [`RawAccess::spoil_cursor_text`].
    async fn spoil_cursor_watcher(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError>;
    /// Overwrites the agent of the head row of `session` with bytes that are not UTF-8 (so the
    /// row no longer answers for `session`), touching nothing else. Returns whether the row
    /// existed; `false` from a store that cannot hold such text there (store-memory, as for
    /// cursors).
    async fn spoil_head_text(&self, session: &SessionRef) -> Result<bool, StoreError>;
    /// Overwrites the session key of the event row `sequence` with bytes that are not UTF-8,
    /// touching nothing else (its head and indexes stay). Returns whether the row existed;
    /// `false` from a store that keeps values (store-memory).
    async fn spoil_event_text(&self, sequence: Sequence) -> Result<bool, StoreError>;
    /// Overwrites the head row of `session` so that the store can no longer read it (a
    /// negative sequence, or bytes that are no head), as a torn write or a hand edit could
    /// leave it, touching nothing else (its events stay). Returns whether the row existed;
    /// `false` from a store that keeps values rather than bytes (store-memory).
    async fn damage_head_row(&self, session: &SessionRef) -> Result<bool, StoreError>;
    /// Moves the store-wide sequence counter forward, as a damaged file or a hand edit could
    /// leave it, so that exactly `left` more sequences can be handed out (to new events or to
    /// dedupe hits, which consume one too) before the counter is at the store's own end:
    /// `u64::MAX - 1` in store-memory and in store-redb (`u64::MAX` keys a ref's head in
    /// store-redb), `i64::MAX` in store-sqlite (`sqlite_sequence`). Touches nothing else. Returns
    /// whether it could: `false` when the counter (or a stored event) is already past that
    /// point, since the counter never goes back, or when the store has fewer than `left`
    /// numbers in all.
    async fn leave_sequences(&self, left: u64) -> Result<bool, StoreError>;
    /// Marks the cursor row `(watcher, target)` ambient ([`crate::WatchProvenance::AmbientGroup`]),
    /// as OpenClaw writes its ambient watch of a group's sessions, touching nothing else.
    /// Returns whether the row existed; `false` from a store that has no room for a
    /// provenance (only OpenClaw makes ambient cursors, and only in its SQLite file:
    /// store-memory and store-redb hold explicit cursors only).
    async fn make_ambient(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError>;
    /// Gives the cursor row `(watcher, target)` a provenance this version does not know
    /// (`ambient-channel`), as a later version's writer or a hand edit could leave it (past the
    /// CHECK that keeps it out of a store this version made), touching nothing else. Returns
    /// whether the row existed; `false` from a store that has no room for a provenance, as for
    /// [`RawAccess::make_ambient`].
    async fn spoil_cursor_provenance(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError>;
}

/// What a store's [`foreign_commits`](crate::EventStore::foreign_commits) answers, as each
/// stamping of the suites that ask it states (`foreign_commits: Counted` or
/// `foreign_commits: Uncounted` in [`conformance_suite!`](crate::conformance_suite),
/// [`durable_suite!`](crate::durable_suite) and [`read_only_suite!`](crate::read_only_suite)):
/// the checks assert the stated answer, so a store that stopped counting (or started) fails
/// them rather than skipping what they check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignCommits {
    /// `Some(count)` on every handle: the store's file can have writers other than the handle
    /// (store-sqlite), whose commits each handle counts.
    Counted,
    /// `None` on every handle: the store's handles share one writer (store-memory,
    /// store-redb), so no commit is another writer's.
    Uncounted,
}

impl ForeignCommits {
    /// Panics unless `answer` is of the stated kind; `what` names the handle and the moment.
    pub fn assert_answer(self, what: &str, answer: Option<u64>) {
        match (self, answer) {
            (Self::Counted, Some(_)) | (Self::Uncounted, None) => {}
            (stated, answer) => panic!(
                "{what}: foreign_commits answered {answer:?}, where the suite was stamped \
                 `foreign_commits: {stated:?}`"
            ),
        }
    }

    /// Whether the store counts foreign commits (`Counted`).
    pub fn counted(self) -> bool {
        self == Self::Counted
    }
}

/// The store factory of the file suites ([`durable`], [`read_only`], [`open`]): an async
/// function that opens the file it is given as a [`Subject`], such as
/// `async fn open(path: PathBuf) -> Result<Subject, StoreError>`.
pub trait OpenFile: AsyncFn(PathBuf) -> Result<Subject, StoreError> {}

impl<F: AsyncFn(PathBuf) -> Result<Subject, StoreError>> OpenFile for F {}

/// A fresh, empty store under test and whatever keeps it alive (a temporary directory).
pub struct Subject {
    /// The store, used through the trait object a gateway holds.
    pub store: Arc<dyn AwarenessStore>,
    /// The same store's upstream links.
    pub upstream: Arc<dyn UpstreamStore>,
    /// Raw row access for the few checks that need it.
    pub raw: Arc<dyn RawAccess>,
    /// How the model test (and the durable suite's check of recordings over an unreadable
    /// head) makes the store batch concurrent recordings, for a store that group-commits them;
    /// `None` for one that does not (store-memory) and for a read-only handle. Its presence
    /// also tells [`checks::cancelled_recordings_cancel_nobody_elses_commit`] that a recording
    /// can be cancelled while under way.
    pub batching: Option<model::Batching>,
    /// Dropped after the check (temporary files).
    pub guard: Box<dyn Any + Send + Sync>,
}

impl Subject {
    /// Bundles a store that also offers upstream links and raw access.
    pub fn new<S>(store: Arc<S>, guard: impl Any + Send + Sync) -> Self
    where
        S: AwarenessStore + UpstreamStore + RawAccess + 'static,
    {
        Self {
            store: store.clone(),
            upstream: store.clone(),
            raw: store,
            batching: None,
            guard: Box::new(guard),
        }
    }

    /// Closes the store through [`EventStore::close`](crate::EventStore::close) and returns once
    /// it is closed, the file quiet: the subject's other handles are dropped, the store is
    /// closed through its last one, then the guard is dropped. Panics if a handle outlived the
    /// subject (a check that leaked one could not know when the file is quiet).
    pub async fn close(self) {
        let Subject {
            store,
            upstream,
            raw,
            batching,
            guard,
        } = self;
        drop((upstream, raw, batching));
        assert_eq!(
            Arc::strong_count(&store),
            1,
            "the subject held every other handle on the store it closes"
        );
        store.close().await;
        drop(guard);
    }
}

/// A directory of its own under the system's temporary directory, removed when dropped (the
/// suites whose checks open files themselves).
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(suite: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "awareness-{suite}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Self(dir)
    }

    /// The store's file in this directory (not created).
    pub(crate) fn file(&self) -> PathBuf {
        self.0.join("state")
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `f` once, as the runtime does for a caller that is then cancelled: answers whether it
/// finished.
pub async fn poll_once<F: Future + ?Sized>(mut f: std::pin::Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx).is_ready())).await
}

/// Everything a store answers about what it holds, as text to compare: the log's range, every
/// head, every cursor, every retained event, and the page of each of `refs` (events, watermark
/// and gap).
pub(crate) async fn observe(s: &dyn AwarenessStore, refs: &[SessionRef]) -> String {
    let mut out = String::new();
    writeln!(out, "{:?}", s.log_stats().await.expect("log_stats")).expect("write");
    writeln!(out, "{:?}", s.list_heads(None).await.expect("list_heads")).expect("write");
    let cursors = s.cursors(&CursorFilter::default()).await.expect("cursors");
    writeln!(out, "{cursors:?}").expect("write");
    let events = s.events_after(Sequence::ZERO, 1_000).await.expect("events");
    writeln!(out, "{events:?}").expect("write");
    for session in refs {
        let page = s
            .changes_since(session, Sequence::ZERO, 200)
            .await
            .expect("changes_since");
        writeln!(out, "{page:?}").expect("write");
    }
    out
}

/// Runs a future to completion on a fresh current-thread tokio runtime with every driver enabled.
pub fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime for the testkit")
        .block_on(f)
}

/// Stamps one named `#[test]` per conformance check for a backend factory
/// (`async fn() -> Subject`): `conformance_suite!(subject, foreign_commits: Counted)` (or
/// `Uncounted`) states what the store's `foreign_commits` answers ([`ForeignCommits`]).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:path, foreign_commits: $foreign:ident) => {
        #[test]
        fn a_handles_own_writes_are_never_foreign_commits() {
            $crate::testkit::block_on_threads(async {
                let subject = $factory().await;
                $crate::testkit::checks::a_handles_own_writes_are_never_foreign_commits(
                    &subject,
                    $crate::testkit::ForeignCommits::$foreign,
                )
                .await;
            });
        }
        $crate::__conformance_tests!(
            $factory;
            record_assigns_increasing_sequences,
            session_status_never_names_an_event_its_page_left_out,
            session_status_across_a_delete_between_its_reads_agrees_with_itself,
            session_status_across_a_head_lost_between_its_reads_reads_the_version_again,
            pending_of_lists_only_pending_cursors,
            a_store_keeps_the_audit_invariants,
            pruning_never_creates_a_head,
            a_session_without_its_head_keeps_its_events,
            the_audit_reports_events_and_cursors_left_without_a_head,
            the_audit_reports_a_cursor_past_its_head,
            the_audit_names_an_unreadable_head_with_its_causes,
            inputs_at_the_limits_read_back_exactly,
            keys_either_side_of_a_length_prefix_boundary_read_back_exactly,
            every_session_is_listed_and_read_however_many,
            keys_that_prefix_each_other_stay_apart,
            a_changes_since_beyond_any_stored_sequence_is_ahead,
            auditing_a_live_store_reports_no_problem_a_write_between_reads_made_up,
            auditing_a_live_store_drops_findings_its_fresh_reads_settle,
            record_returns_every_field,
            text_fields_round_trip_exactly,
            payload_keys_keep_the_order_they_were_recorded_in,
            json_nested_too_deep_is_rejected_and_the_deepest_allowed_reads_back,
            dedupe_returns_stored_event_and_moves_nothing,
            dedupe_keys_are_store_wide,
            dedupe_hit_consumes_a_sequence,
            dedupe_key_is_free_again_after_its_row_is_pruned,
            a_counter_at_its_end_refuses_to_record_and_writes_nothing,
            recordings_that_take_the_last_numbers_commit_as_one_batch,
            occurred_at_is_clamped_into_the_last_day,
            occurred_at_defaults_to_now,
            head_tracks_last_sequence_and_local_clock,
            same_key_under_two_agents_is_two_sessions,
            heads_survive_pruning,
            heads_unaffected_by_deleting_other_refs,
            sequences_never_reused_after_prune_and_delete,
            history_gap_only_from_pruned_watermark,
            history_gap_after_prune,
            earliest_available_is_smallest_retained,
            earliest_available_is_head_plus_one_when_all_pruned,
            earliest_available_is_zero_for_unknown_session,
            changes_since_returns_exactly_that_ref_after_n,
            limit_is_clamped_and_truncated_reported,
            version_ahead_when_caller_is_past_the_head,
            changes_since_moves_no_cursor,
            twenty_material_events_one_byte_identical_notice,
            frozen_watermark_stays_at_first_unseen_event,
            every_material_event_hands_the_notice_to_delivery,
            concurrent_records_each_get_their_own_event,
            cancelled_recordings_cancel_nobody_elses_commit,
            a_recording_given_up_in_the_queue_is_never_committed,
            cursor_writes_racing_recordings_lose_no_event,
            removals_racing_recordings_bring_no_cursor_back,
            a_first_watch_racing_a_recording_loses_no_event,
            a_deletion_racing_a_spawn_leaves_both_or_neither,
            marker_updates_racing_under_one_token_write_at_most_once,
            pages_read_while_pruning_never_hide_a_loss,
            acknowledge_with_interleaved_event_reopens_exactly_one,
            acknowledge_without_pending_changes_nothing,
            acknowledge_ignores_unknown_targets,
            an_acknowledgement_of_nothing_takes_no_lock,
            acknowledging_a_target_twice_in_one_call_acknowledges_it_once,
            an_acknowledgement_of_a_notice_no_longer_shown_changes_nothing,
            refreezing_a_key_twice_in_one_call_redelivers_once,
            self_caused_events_never_notify,
            an_ambient_cursor_stays_ambient_until_a_spawn_or_watch,
            a_cursor_row_of_a_provenance_this_version_does_not_know_is_unreadable,
            an_ambient_cursor_is_re_pointed_pruned_and_deleted_as_any_other,
            log_only_kinds_move_the_head_only,
            seed_starts_cursor_at_spawn_sequence,
            seeding_keeps_a_pending_notice,
            reseeding_a_quiet_cursor_moves_it,
            named_watcher_without_cursor_starts_at_zero,
            a_named_watcher_already_watching_is_moved_from_where_it_read,
            a_named_watcher_on_another_agents_session_of_the_key_is_re_pointed,
            a_watcher_named_twice_or_the_session_itself_counts_once_or_not_at_all,
            notify_ignores_cursor_on_other_agents_session,
            watch_starts_at_head,
            watch_on_empty_target_starts_at_zero,
            a_watch_of_itself_is_refused_and_writes_nothing,
            watching_again_keeps_pending_state,
            watching_another_agents_session_of_the_same_key_moves_the_cursor,
            a_spawn_moves_a_pending_cursor_on_another_agents_session_of_the_key,
            unwatch_removes_cursor_and_stops_notices,
            reset_removes_own_watches_and_keeps_history,
            delete_removes_ref_and_leaves_other_agent_alone,
            sweep_refreezes_and_redelivers,
            sweep_skips_watchers_that_no_longer_exist,
            refreeze_of_quiet_cursor_is_noop,
            prune_by_age_stamps_the_watermark_of_what_it_deletes,
            prune_row_cap_keeps_newest_rows,
            prune_keeps_a_cursor_updated_exactly_at_the_idle_cutoff,
            prune_expires_idle_cursors,
            an_invalid_retention_policy_is_refused_and_nothing_deleted,
            prune_runs_in_bounded_chunks,
            a_chunk_deletes_its_whole_bound_however_it_is_split,
            pruning_stamps_the_heads_it_raises_with_its_time,
            a_prune_below_the_watermark_keeps_it,
            invalid_summary_is_rejected_and_nothing_written,
            invalid_payload_is_rejected_and_nothing_written,
            invalid_ids_are_rejected_and_nothing_written,
            cursors_filter_and_order,
            list_heads_by_agent,
            heads_of_refs_crossing_keys_and_agents_are_exact,
            pruning_racing_recordings_lowers_no_head,
            a_prune_behind_a_heads_clock_leaves_the_clock,
            an_invalid_event_under_a_stored_dedupe_key_is_refused,
            events_after_and_log_stats,
            heads_batch_returns_only_existing,
            upstream_upsert_creates_then_same_source_keeps_marker,
            upstream_changed_source_rebases_marker,
            upstream_marker_update_is_compare_and_set,
            upstream_mark_scanned_keeps_the_cas_token,
            upstream_remove_link_with_and_without_token,
            upstream_delete_session_removes_only_that_refs_link,
            upstream_links_ordered_and_json_round_trips,
            upstream_invalid_spec_is_rejected_and_nothing_written,
        );
        /// The cancellation check again on one thread, where a caller cancelled before its
        /// task ran at all is one round in four (on two workers, idle ones take the tasks at
        /// once).
        #[test]
        fn cancelled_recordings_cancel_nobody_elses_commit_on_one_thread() {
            $crate::testkit::block_on(async {
                let subject = $factory().await;
                $crate::testkit::checks::cancelled_recordings_cancel_nobody_elses_commit(&subject)
                    .await;
            });
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($factory:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                // Two worker threads: the tasks a check spawns to race each other truly run at
                // once, also against a store that never waits inside a call (store-memory).
                $crate::testkit::block_on_threads(async {
                    let subject = $factory().await;
                    $crate::testkit::checks::$name(&subject).await;
                });
            }
        )*
    };
}

/// Runs a future to completion on a fresh multi-thread tokio runtime (two workers), for checks
/// whose callers must truly run at once.
pub fn block_on_threads<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build a tokio runtime for the testkit")
        .block_on(f)
}

/// Defines `Raw`, a [`RawAccess`] over an `Arc` of a store type that has inherent methods of
/// the trait's names (`delete_event_row`, `delete_head_row`, `damage_event_row`,
/// `damage_cursor_row`, `damage_link_row`, `damage_head_row`, `leave_sequences`,
/// `make_ambient` and the `spoil_*` ones, each async and answering `Result<bool, _>`), as
/// the durable stores have: one forwarding for every suite a store runs.
#[macro_export]
macro_rules! raw_access_forwarding {
    ($store:ty) => {
        /// [`RawAccess`]($crate::testkit::RawAccess) through the store's own row helpers.
        struct Raw(::std::sync::Arc<$store>);

        #[$crate::async_trait]
        impl $crate::testkit::RawAccess for Raw {
            async fn delete_event_row(
                &self,
                sequence: $crate::Sequence,
            ) -> ::std::result::Result<(), $crate::StoreError> {
                self.0.delete_event_row(sequence).await.map(drop)
            }

            async fn delete_head_row(
                &self,
                session: &$crate::SessionRef,
            ) -> ::std::result::Result<(), $crate::StoreError> {
                self.0.delete_head_row(session).await.map(drop)
            }

            async fn damage_event_row(
                &self,
                sequence: $crate::Sequence,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.damage_event_row(sequence).await
            }

            async fn damage_cursor_row(
                &self,
                watcher: &$crate::WatcherKey,
                target: &$crate::SessionKey,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.damage_cursor_row(watcher, target).await
            }

            async fn damage_link_row(
                &self,
                session: &$crate::SessionRef,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.damage_link_row(session).await
            }

            async fn spoil_link_text(
                &self,
                session: &$crate::SessionRef,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_link_text(session).await
            }

            async fn spoil_link_key(
                &self,
                session: &$crate::SessionRef,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_link_key(session).await
            }

            async fn spoil_cursor_text(
                &self,
                watcher: &$crate::WatcherKey,
                target: &$crate::SessionKey,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_cursor_text(watcher, target).await
            }

            async fn spoil_cursor_watcher(
                &self,
                watcher: &$crate::WatcherKey,
                target: &$crate::SessionKey,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_cursor_watcher(watcher, target).await
            }

            async fn spoil_head_text(
                &self,
                session: &$crate::SessionRef,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_head_text(session).await
            }

            async fn spoil_event_text(
                &self,
                sequence: $crate::Sequence,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_event_text(sequence).await
            }

            async fn damage_head_row(
                &self,
                session: &$crate::SessionRef,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.damage_head_row(session).await
            }

            async fn leave_sequences(
                &self,
                left: u64,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.leave_sequences(left).await
            }

            async fn make_ambient(
                &self,
                watcher: &$crate::WatcherKey,
                target: &$crate::SessionKey,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.make_ambient(watcher, target).await
            }

            async fn spoil_cursor_provenance(
                &self,
                watcher: &$crate::WatcherKey,
                target: &$crate::SessionKey,
            ) -> ::std::result::Result<bool, $crate::StoreError> {
                self.0.spoil_cursor_provenance(watcher, target).await
            }
        }
    };
}

/// Stamps one named `#[test]` per group-commit check ([`group_commit`]) for a store factory
/// (`async fn(PathBuf, usize) -> Result<group_commit::Grouped, StoreError>`: open the given
/// file with that `group_commit`).
///
/// `group_commit_suite!(open)` is for a store whose recordings need the caller's Tokio runtime
/// (they commit a batch on a task of it): it checks that one outside a runtime fails clearly.
/// `group_commit_suite!(open, needs_a_runtime: false)` is for a store that runs its work on a
/// runtime of its own: it checks instead that a recording made outside any runtime is answered.
#[macro_export]
macro_rules! group_commit_suite {
    ($open:path) => {
        $crate::group_commit_suite!(@each $open; a_recording_outside_a_runtime_fails_and_queues_nothing);
    };
    ($open:path, needs_a_runtime: false) => {
        $crate::group_commit_suite!(@each $open; a_recording_outside_a_runtime_is_answered);
    };
    (@each $open:path; $($outside:ident),*) => {
        $crate::__group_commit_tests!(
            $open;
            concurrent_recordings_share_write_transactions,
            concurrent_recordings_leave_each_head_at_its_last_event,
            text_recorded_in_a_batch_reads_back_exactly,
            a_batch_answers_as_its_recordings_one_at_a_time,
            group_commit_of_one_commits_every_recording_alone,
            a_batch_holds_at_most_group_commit_recordings,
            a_group_commit_of_zero_is_refused_at_open,
            cancelled_recordings_hold_up_no_later_one,
            a_batch_on_a_target_with_an_unreadable_cursor_row_commits,
            a_batch_over_an_unreadable_head_stamps_it_below_its_own_event,
            writes_outside_a_runtime_fail_and_leave_the_handle_working,
            recordings_crossing_the_end_of_the_counter_commit_only_those_that_fit,
            $($outside),*
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __group_commit_tests {
    ($open:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testkit::block_on_threads(
                    $crate::testkit::group_commit::$name($open),
                );
            }
        )*
    };
}

/// Stamps one named `#[test]` per check of what a file keeps ([`durable`]) for a store factory
/// (`async fn(PathBuf) -> Result<Subject, StoreError>`: open the given file, creating it when
/// missing).
///
/// `durable_suite!(open, foreign_commits: Counted)` (or `Uncounted`, what the store's
/// `foreign_commits` answers: [`ForeignCommits`]) stamps every check;
/// `durable_suite!(open, foreign_commits: Uncounted, text_in_every_row: false)`
/// leaves out the three whose rows must hold text that is not UTF-8, for a store that keeps it in
/// a string type that checks it (none of this workspace's since stop 47): those checks would
/// have nothing to check, and a check that cannot fail is not stamped. Every other check asserts
/// that the store's [`RawAccess`] helpers found and damaged their row.
#[macro_export]
macro_rules! durable_suite {
    ($open:path, foreign_commits: $foreign:ident) => {
        $crate::durable_suite!($open, foreign_commits: $foreign, text_in_every_row: false);
        $crate::__durable_tests!(
            $open;
            a_cursor_row_with_text_that_is_not_utf8_is_left_out_and_stops_nothing_else,
            a_head_with_text_that_is_not_utf8_stops_neither_listing_nor_pruning,
            a_head_and_an_event_with_text_that_is_not_utf8_together_stop_no_pruning,
            listings_past_a_row_that_is_not_utf8_keep_key_then_agent_order,
        );
    };
    ($open:path, foreign_commits: $foreign:ident, text_in_every_row: false) => {
        #[test]
        fn each_handle_sees_the_other_handles_commits_as_foreign() {
            $crate::testkit::block_on_threads(
                $crate::testkit::durable::each_handle_sees_the_other_handles_commits_as_foreign(
                    $open,
                    $crate::testkit::ForeignCommits::$foreign,
                ),
            );
        }
        $crate::__durable_tests!(
            $open;
            another_handles_commit_is_hinted,
            a_store_that_pushes_hints_gives_one_as_it_begins,
            everything_committed_survives_a_reopen,
            a_closed_store_leaves_every_commit_in_its_file,
            a_store_closed_right_after_a_cancelled_write_leaves_it_in_its_file,
            closing_the_last_handle_keeps_what_a_dropped_handle_left_running,
            a_store_outlives_the_runtimes_that_used_it,
            the_sequence_never_goes_back_across_reopens,
            two_handles_on_one_file_see_each_others_writes,
            a_cancelled_write_leaves_the_file_writable,
            a_cancelled_acknowledgement_or_refreeze_moves_both_cursors_or_neither,
            a_cancelled_prune_leaves_every_loss_behind_a_watermark,
            a_dedupe_hit_on_an_unreadable_row_fails_and_changes_nothing,
            an_unreadable_dedupe_hit_among_concurrent_recordings_fails_only_its_caller,
            an_unreadable_row_stops_neither_pruning_nor_deleting_its_session,
            an_unreadable_row_removed_frees_its_dedupe_key_and_no_other,
            an_unreadable_cursor_row_is_left_out_and_stops_nothing_else,
            a_warning_names_the_file,
            an_unreadable_link_row_is_left_out_and_stops_no_other_link,
            a_link_row_with_text_that_is_not_utf8_is_left_out,
            an_unreadable_head_row_is_left_out_of_the_listings,
            an_unreadable_head_fails_no_read_of_another_agents_session_of_its_key,
            an_event_with_text_that_is_not_utf8_is_pruned_in_its_turn,
            an_event_with_text_that_is_not_utf8_fails_the_log_naming_it,
            an_unreadable_event_row_fails_the_reads_that_reach_it_naming_it,
            the_audit_reports_an_unreadable_event_row_and_audits_the_rest,
            a_recording_over_an_unreadable_head_reports_a_history_gap,
            errors_after_open_name_the_file_once,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __durable_tests {
    ($open:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testkit::block_on_threads($crate::testkit::durable::$name($open));
            }
        )*
    };
}

/// Stamps one named `#[test]` per check of a read-only handle ([`read_only`]) for two store
/// factories (`async fn(PathBuf) -> Result<Subject, StoreError>`): the first opens the given
/// file read-write, creating it when missing; the second opens it read-only.
///
/// `read_only_suite!(open, open_read_only, left_open: NeedsRepair, foreign_commits: Uncounted)`
/// states what a read-only open of the files of a writer that never closed answers (a
/// [`read_only::LeftOpen`]: `Answers`, what the writer had committed, or `NeedsRepair`;
/// without it, `Answers`) and what the store's `foreign_commits` answers on every handle
/// ([`ForeignCommits`], always stated).
#[macro_export]
macro_rules! read_only_suite {
    ($open:path, $open_read_only:path, foreign_commits: $foreign:ident) => {
        $crate::read_only_suite!(
            $open,
            $open_read_only,
            left_open: Answers,
            foreign_commits: $foreign
        );
    };
    (
        $open:path,
        $open_read_only:path,
        left_open: $left_open:ident,
        foreign_commits: $foreign:ident
    ) => {
        #[test]
        fn a_read_only_handle_beside_a_read_write_one_sees_its_commits() {
            $crate::testkit::block_on_threads(
                $crate::testkit::read_only::a_read_only_handle_beside_a_read_write_one_sees_its_commits(
                    $open,
                    $open_read_only,
                    $crate::testkit::ForeignCommits::$foreign,
                ),
            );
        }
        #[test]
        fn a_read_only_handle_on_a_file_its_writer_left_open_changes_no_file() {
            $crate::testkit::block_on_threads(
                $crate::testkit::read_only::a_read_only_handle_on_a_file_its_writer_left_open_changes_no_file(
                    $open,
                    $open_read_only,
                    $crate::testkit::read_only::LeftOpen::$left_open,
                ),
            );
        }
        $crate::__read_only_tests!(
            $open, $open_read_only;
            a_read_only_handle_answers_what_the_file_holds,
            a_read_only_handle_refuses_every_write_and_changes_nothing,
            a_read_only_handle_refuses_bad_input_as_invalid_input,
            a_read_only_open_creates_nothing,
            a_read_only_open_refuses_a_file_that_is_not_a_store,
            a_read_only_open_refuses_a_truncated_store_and_changes_nothing,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __read_only_tests {
    ($open:path, $open_read_only:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testkit::block_on_threads(
                    $crate::testkit::read_only::$name($open, $open_read_only),
                );
            }
        )*
    };
}

/// Stamps one named `#[test]` per check of what a read-write open refuses and accepts ([`open`])
/// for a store factory (`async fn(PathBuf) -> Result<Subject, StoreError>`: open the given file
/// read-write with the store's default options, creating it when missing).
///
/// The checks of an open by a user who may not write are stamped apart, in a test target of
/// their own ([`permission_suite!`](crate::permission_suite)).
#[macro_export]
macro_rules! open_suite {
    ($open:path) => {
        $crate::__open_tests!(
            $open;
            a_directory_is_refused,
            a_missing_directory_is_not_created,
            a_file_that_is_not_a_store_is_refused_and_left_untouched,
            a_truncated_file_is_refused_and_left_untouched,
            an_empty_file_becomes_a_new_store,
            two_opens_of_a_new_file_at_once_both_succeed_and_share_it,
            an_open_cancelled_at_any_moment_leaves_a_path_that_opens,
        );
        #[cfg(unix)]
        #[test]
        fn new_files_are_private_to_their_owner() {
            $crate::testkit::block_on_threads(
                $crate::testkit::open::new_files_are_private_to_their_owner($open),
            );
        }
    };
}

/// Stamps the checks of an open by a user who may not write the store's directory or its file,
/// read its file, or search its directory ([`open`]:
/// [`open::a_directory_without_write_permission_gives_a_clear_error`],
/// [`open::a_store_file_the_user_may_not_write_gives_a_clear_error`],
/// [`open::a_store_file_the_user_may_not_read_gives_a_clear_error`],
/// [`open::a_directory_the_user_may_not_search_gives_a_clear_error`]; Unix only) for a store
/// factory, as [`open_suite!`] takes it.
///
/// Stamp it in a test target of its own (a `tests/*.rs` file that holds nothing else): each
/// check opens as another user in a process of its own, the test binary started again to run
/// that one check, which then opens the path it is given through `$open` and reports. Between
/// its fork and its exec such a child holds copies of every file the binary's other tests
/// have open (a store's lock among them), so a test running beside it could find its own file
/// "already open in another process". The checks of one binary run one at a time.
#[macro_export]
macro_rules! permission_suite {
    ($open:path) => {
        $crate::__open_tests_as_another_user!(
            $open;
            a_directory_without_write_permission_gives_a_clear_error,
            a_store_file_the_user_may_not_write_gives_a_clear_error,
            a_store_file_the_user_may_not_read_gives_a_clear_error,
            a_directory_the_user_may_not_search_gives_a_clear_error,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __open_tests_as_another_user {
    ($open:path; $($name:ident),* $(,)?) => {
        $(
            #[cfg(unix)]
            #[test]
            fn $name() {
                let _one_at_a_time = $crate::testkit::open::one_at_a_time();
                $crate::testkit::block_on_threads($crate::testkit::open::$name(
                    $open,
                    $crate::testkit::open::ThisTest::new(module_path!(), stringify!($name)),
                ));
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __open_tests {
    ($open:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testkit::block_on_threads($crate::testkit::open::$name($open));
            }
        )*
    };
}

/// Stamps the property-based model test for a backend factory (`async fn() -> Subject`). The
/// number of cases comes from `PROPTEST_CASES` (default 256).
#[macro_export]
macro_rules! model_test {
    ($factory:path) => {
        #[test]
        fn model_test_matches_reference() {
            $crate::testkit::model::run(|| async { $factory().await });
        }
    };
}
