//! Settings checked before anything starts.
//!
//! A zero interval, timeout, count or size does not mean "as fast as possible" or "none": it
//! would run ticks or pruning passes back to back, fail every check as timed out, or keep
//! nothing. Such a setting is refused with a [`ConfigError`] naming it, by
//! [`AwarenessConfig::validate`](crate::AwarenessConfig::validate),
//! [`MonitorConfig::validate`](crate::MonitorConfig::validate) and the fallible constructors
//! built on them ([`AwarenessBuilder::try_build`](crate::AwarenessBuilder::try_build),
//! [`MonitorBuilder::try_build`](crate::upstream::MonitorBuilder::try_build),
//! [`JsonlProvider::try_with_budget`](crate::JsonlProvider::try_with_budget),
//! [`InMemoryQueue::try_with_capacity`](crate::InMemoryQueue::try_with_capacity)). Their
//! infallible counterparts panic with the same error: a setting that comes from a user goes
//! through the fallible ones.

use std::time::Duration;

use awareness_core::ValidationError;

/// A setting refused before anything starts: which one, its value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value below the least the setting can work with (a zero interval, timeout, count or
    /// size).
    #[error("{field} is {value}; {rule}")]
    TooSmall {
        /// The setting (`MonitorConfig.interval`, `AwarenessConfig.list_batch`, ...).
        field: &'static str,
        /// Its value, as given.
        value: String,
        /// What it must be, and why.
        rule: &'static str,
    },
    /// A retention policy that would delete what it is meant to keep
    /// ([`RetentionPolicy::validate`](awareness_core::RetentionPolicy::validate)); the reason
    /// names the policy's field. The reason is in the text, and is not also the error's
    /// source (a reporter walking the sources would print it twice).
    #[error("{field}: {reason}")]
    Retention {
        /// The setting holding the policy (`AwarenessConfig.retention`).
        field: &'static str,
        /// Why the policy was refused.
        reason: ValidationError,
    },
}

impl ConfigError {
    /// The setting refused.
    pub fn field(&self) -> &'static str {
        match self {
            ConfigError::TooSmall { field, .. } | ConfigError::Retention { field, .. } => field,
        }
    }
}

/// Far enough to mean never: a time the clock cannot reach is this far ahead instead.
pub(crate) const FOREVER: Duration = Duration::from_hours(100 * 365 * 24);

/// `now + wait`, or `now + FOREVER` for a wait too long for the clock.
pub(crate) fn after(now: tokio::time::Instant, wait: Duration) -> tokio::time::Instant {
    now.checked_add(wait).unwrap_or_else(|| now + FOREVER)
}

/// Refuses a duration below 1 ms (tokio's timers count whole milliseconds).
pub(crate) fn at_least_1ms(
    field: &'static str,
    value: Duration,
    rule: &'static str,
) -> Result<(), ConfigError> {
    if value < Duration::from_millis(1) {
        return Err(ConfigError::TooSmall {
            field,
            value: format!("{value:?}"),
            rule,
        });
    }
    Ok(())
}

/// Refuses a count or size of 0.
pub(crate) fn at_least_one(
    field: &'static str,
    value: u64,
    rule: &'static str,
) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::TooSmall {
            field,
            value: value.to_string(),
            rule,
        });
    }
    Ok(())
}
