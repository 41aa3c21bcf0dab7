//! Settings that cannot work are refused before anything starts, each with an error naming the
//! setting; the defaults pass.

use std::sync::Arc;
use std::time::Duration;

use awareness_core::RetentionPolicy;
use awareness_core::error::ErrorChain;
use gateway_adapter::upstream::{JsonlProvider, MonitorConfig, UpstreamMonitor};
use gateway_adapter::{
    Awareness, AwarenessBuilder, AwarenessConfig, ConfigError, InMemoryDirectory, InMemoryQueue,
    RecordingWake,
};
use store_memory::MemoryStore;

fn builder() -> AwarenessBuilder {
    Awareness::builder(
        Arc::new(MemoryStore::new()),
        Arc::new(InMemoryQueue::new()),
        Arc::new(RecordingWake::new()),
        Arc::new(InMemoryDirectory::new()),
    )
}

fn awareness() -> Arc<Awareness> {
    Arc::new(builder().build())
}

/// The error's setting and its whole text.
fn named(e: &ConfigError) -> (&'static str, String) {
    (e.field(), ErrorChain(e).to_string())
}

#[test]
fn the_defaults_and_any_first_tick_pass() {
    MonitorConfig::default().validate().expect("default timing");
    AwarenessConfig::default()
        .validate()
        .expect("default settings");
    for first_tick in [Duration::ZERO, Duration::MAX] {
        MonitorConfig {
            first_tick,
            ..MonitorConfig::default()
        }
        .validate()
        .expect("any first tick");
    }
    let tight = MonitorConfig {
        interval: Duration::from_millis(1),
        provider_timeout: Duration::from_millis(1),
        missing_checks: 1,
        ..MonitorConfig::default()
    };
    tight.validate().expect("the least accepted timing");
    assert!(builder().try_build().is_ok());
    assert!(JsonlProvider::new().try_with_budget(1).is_ok());
    assert!(InMemoryQueue::try_with_capacity(1).is_ok());
}

#[test]
fn refused_monitor_timing_names_its_field() {
    let cases = [
        (
            MonitorConfig {
                interval: Duration::ZERO,
                ..MonitorConfig::default()
            },
            "MonitorConfig.interval",
            "back to back",
        ),
        (
            MonitorConfig {
                interval: Duration::from_micros(999),
                ..MonitorConfig::default()
            },
            "MonitorConfig.interval",
            "at least 1 ms",
        ),
        (
            MonitorConfig {
                provider_timeout: Duration::ZERO,
                ..MonitorConfig::default()
            },
            "MonitorConfig.provider_timeout",
            "timed out",
        ),
        (
            MonitorConfig {
                missing_checks: 0,
                ..MonitorConfig::default()
            },
            "MonitorConfig.missing_checks",
            "at least 1",
        ),
    ];
    let store = Arc::new(MemoryStore::new());
    for (config, field, why) in cases {
        let e = config.validate().expect_err(field);
        let (got, text) = named(&e);
        assert_eq!(got, field, "{text}");
        assert!(
            text.starts_with(field) && text.contains(why),
            "{field}: {text}"
        );
        let built = UpstreamMonitor::builder(awareness(), store.clone())
            .config(config)
            .try_build();
        assert_eq!(
            built.map(|_| ()).unwrap_err(),
            e,
            "try_build refuses it too"
        );
    }
}

/// The service's defaults are the documented ones: 500 refs per `heads` call, a pick-up of every
/// pending notice each minute, and 4,096 writes outstanding at most. (What the mutation did:
/// changed a default (50 refs, a recovery every 10 minutes, 1,024 writes), which passed every
/// other test; a gateway on the defaults then waited ten times as long for a lost notice, or
/// refused writes sooner; review of stop 71, SE37, SE39 and SE40.)
#[test]
fn the_service_defaults_are_the_documented_ones() {
    let d = AwarenessConfig::default();
    assert_eq!(d.list_batch, 500, "list_batch");
    assert_eq!(
        d.recovery_interval,
        Duration::from_mins(1),
        "recovery_interval"
    );
    assert_eq!(
        d.max_pending_writes,
        gateway_adapter::DEFAULT_MAX_PENDING_WRITES,
        "max_pending_writes"
    );
    assert_eq!(gateway_adapter::DEFAULT_MAX_PENDING_WRITES, 4_096);
}

#[test]
fn refused_service_settings_name_their_field() {
    let cases = [
        (
            AwarenessConfig {
                retention: RetentionPolicy {
                    max_age_ms: 0,
                    ..RetentionPolicy::default()
                },
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.retention",
            "maxAgeMs is 0",
        ),
        (
            AwarenessConfig {
                retention: RetentionPolicy {
                    max_rows: 0,
                    ..RetentionPolicy::default()
                },
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.retention",
            "maxRows is 0",
        ),
        (
            AwarenessConfig {
                prune_interval: Duration::ZERO,
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.prune_interval",
            "back to back",
        ),
        (
            AwarenessConfig {
                pickup_interval: Duration::from_micros(999),
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.pickup_interval",
            "back to back",
        ),
        (
            AwarenessConfig {
                recovery_interval: Duration::ZERO,
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.recovery_interval",
            "back to back",
        ),
        (
            AwarenessConfig {
                store_wait: Duration::ZERO,
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.store_wait",
            "without the store",
        ),
        (
            AwarenessConfig {
                list_batch: 0,
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.list_batch",
            "at least 1",
        ),
        (
            AwarenessConfig {
                max_pending_writes: 0,
                ..AwarenessConfig::default()
            },
            "AwarenessConfig.max_pending_writes",
            "refuses every recording",
        ),
    ];
    for (config, field, why) in cases {
        let e = config.validate().expect_err(field);
        let (got, text) = named(&e);
        assert_eq!(got, field, "{text}");
        assert!(
            text.starts_with(field) && text.contains(why),
            "{field}: {text}"
        );
        let built = builder().config(config).try_build();
        assert_eq!(
            built.map(|_| ()).unwrap_err(),
            e,
            "try_build refuses it too"
        );
    }
}

#[test]
fn a_zero_budget_or_capacity_names_its_setting() {
    let e = JsonlProvider::new().try_with_budget(0).unwrap_err();
    assert_eq!(e.field(), "JsonlProvider.budget", "{e}");
    let e = InMemoryQueue::try_with_capacity(0).unwrap_err();
    assert_eq!(e.field(), "InMemoryQueue.capacity", "{e}");
}

#[test]
#[should_panic(expected = "AwarenessConfig.retention: retention policy: cursorIdleMs is 0")]
fn the_infallible_service_builder_panics_on_a_refused_setting() {
    let _ = builder()
        .config(AwarenessConfig {
            retention: RetentionPolicy {
                cursor_idle_ms: 0,
                ..RetentionPolicy::default()
            },
            ..AwarenessConfig::default()
        })
        .build();
}

#[test]
#[should_panic(expected = "MonitorConfig.interval is 0ns")]
fn the_infallible_monitor_builder_panics_on_a_refused_setting() {
    let _ = UpstreamMonitor::builder(awareness(), Arc::new(MemoryStore::new()))
        .config(MonitorConfig {
            interval: Duration::ZERO,
            ..MonitorConfig::default()
        })
        .build();
}

#[test]
#[should_panic(expected = "InMemoryQueue.capacity is 0")]
fn a_zero_capacity_queue_panics() {
    let _ = InMemoryQueue::with_capacity(0);
}

#[test]
#[should_panic(expected = "JsonlProvider.budget is 0")]
fn a_zero_budget_provider_panics() {
    let _ = JsonlProvider::new().with_budget(0);
}

/// `AwarenessConfig::store_wait` has no upper bound: `Duration::MAX` (never go on without the
/// store) is accepted, and the producers, the turn and the pick-up work with it. The deadline
/// the producers computed from it overflowed the clock and panicked every recording.
#[tokio::test]
async fn a_store_wait_of_duration_max_waits_for_the_store() {
    let config = AwarenessConfig {
        store_wait: Duration::MAX,
        ..AwarenessConfig::default()
    };
    config.validate().expect("no upper bound");
    let svc = builder().config(config).build();
    let manager = awareness_core::SessionKey::new("agent:main:main").unwrap();
    let child = awareness_core::SessionKey::new("agent:main:subagent:c").unwrap();
    svc.subagent_spawned(&child, None, &manager, "run-1")
        .await
        .expect("spawned");
    let mut msg = gateway_adapter::HumanMessage::new(child);
    msg.entry = Some(gateway_adapter::SessionEntry {
        spawned_by: Some(manager.clone()),
        ..gateway_adapter::SessionEntry::default()
    });
    assert!(svc.human_message(msg).await.is_some(), "recorded");
    assert_eq!(svc.drain_turn(&manager).await.len(), 1, "the notice");
    let picked = svc.pick_up().await;
    assert!(
        picked.complete && picked.queued == 0,
        "the pick-up waits for the store and finds nothing left: {picked:?}"
    );
}

/// A refused retention policy says why once, in its text, and is not also the error's source:
/// a reporter that prints each source after the text (anyhow's `{:#}`, for one) printed the
/// reason twice.
#[test]
fn a_refused_retention_policy_says_why_once() {
    let e = AwarenessConfig {
        retention: RetentionPolicy {
            cursor_idle_ms: 0,
            ..RetentionPolicy::default()
        },
        ..AwarenessConfig::default()
    }
    .validate()
    .unwrap_err();
    assert!(std::error::Error::source(&e).is_none(), "{e:?}");
    let text = awareness_core::error::ErrorChain(&e).to_string();
    assert_eq!(text.matches("cursorIdleMs is 0").count(), 1, "{text}");
}
