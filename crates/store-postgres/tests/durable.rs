//! store-postgres runs the checks of the durable suite that a server's store shares with a
//! file's: reopening, two handles on one store (two gateways), cancelled writes, rows that can
//! no longer be read. The suite names a store by a file path; here a path names a schema (a
//! hash of it), so that opening the same path again opens the same store.
//!
//! Left out, each for a reason that holds for every store on a server: the three checks that
//! copy the store's file once it is closed (there is no file: what a server keeps after a
//! client closes is the server's durability, not the store's), the two that look for the file's
//! path in errors and warnings (they name the schema: `PgStore`'s docs), and those whose rows
//! hold text that is not UTF-8 (a database that encodes text as UTF-8, the only kind the store
//! connects to, refuses such text: the `spoil_*` helpers answer `false`).

mod server;

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use store_postgres::{PgStore, PgStoreOptions};

awareness_core::raw_access_forwarding!(PgStore);

/// The store the suite's `path` names ([`server::schema_of_path`]), created on first open.
async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    let schema = server::schema_of_path(&path);
    let store =
        Arc::new(PgStore::connect(server::server(), PgStoreOptions::new(schema.clone())).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(Arc::clone(&store))),
        batching: Some(server::batching(Arc::clone(&store), schema)),
        guard: Box::new(()),
    })
}

macro_rules! durable_checks {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                awareness_core::testkit::block_on_threads(
                    awareness_core::testkit::durable::$name(open),
                );
            }
        )*
    };
}

#[test]
fn each_handle_sees_the_other_handles_commits_as_foreign() {
    awareness_core::testkit::block_on_threads(
        awareness_core::testkit::durable::each_handle_sees_the_other_handles_commits_as_foreign(
            open,
            awareness_core::testkit::ForeignCommits::Counted,
        ),
    );
}

durable_checks!(
    another_handles_commit_is_hinted,
    a_store_that_pushes_hints_gives_one_as_it_begins,
    everything_committed_survives_a_reopen,
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
    an_unreadable_link_row_is_left_out_and_stops_no_other_link,
    an_unreadable_head_row_is_left_out_of_the_listings,
    an_unreadable_head_fails_no_read_of_another_agents_session_of_its_key,
    an_unreadable_event_row_fails_the_reads_that_reach_it_naming_it,
    the_audit_reports_an_unreadable_event_row_and_audits_the_rest,
    a_recording_over_an_unreadable_head_reports_a_history_gap,
);
