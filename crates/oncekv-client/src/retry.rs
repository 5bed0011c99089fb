//! The retry policy of the client library: exponential backoff with full
//! jitter, bounded by the call's deadline. Pure: the random source and the
//! clock are the caller's.

use std::time::Duration;

/// Backoff parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Ceiling of the first wait.
    pub base: Duration,
    /// Largest ceiling of any wait.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_millis(10),
            // Low: after a leader crash the client's attempts climb the
            // ladder while the election runs, and the wait drawn just before
            // the new leader appears adds directly to the failover time
            // (a 500 ms cap added ~250 ms on average). Attempts are cheap:
            // a refused connection or a NOT_LEADER answer.
            cap: Duration::from_millis(100),
        }
    }
}

impl Backoff {
    /// The ceiling before retry number `attempt` (0 for the first retry):
    /// `min(cap, base · 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait before retry `attempt` with full jitter: uniform in
    /// `[0, ceiling]`, picked by `unit` in `[0, 1)`, and never past
    /// `remaining` (the time left before the call's deadline).
    pub fn delay(&self, attempt: u32, unit: f64, remaining: Duration) -> Duration {
        let unit = unit.clamp(0.0, 1.0);
        self.ceiling(attempt).mul_f64(unit).min(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ceilings double from the base up to the cap, and never overflow.
    #[test]
    fn ceilings_grow_to_the_cap() {
        let backoff = Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(300),
        };
        let ceilings: Vec<u64> = (0..7)
            .map(|attempt| backoff.ceiling(attempt).as_millis() as u64)
            .collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_millis(300));
    }

    /// Full jitter stays within [0, ceiling] and within the deadline.
    #[test]
    fn delays_stay_within_bounds() {
        let backoff = Backoff::default();
        for attempt in 0..30 {
            for unit in [0.0, 0.25, 0.5, 0.999, 1.0, 7.0, -1.0] {
                let delay = backoff.delay(attempt, unit, Duration::from_secs(10));
                assert!(delay <= backoff.ceiling(attempt));
            }
            assert_eq!(
                backoff.delay(attempt, 0.9, Duration::from_millis(1)),
                Duration::from_millis(1).min(backoff.ceiling(attempt).mul_f64(0.9))
            );
        }
        assert_eq!(
            backoff.delay(3, 0.0, Duration::from_secs(1)),
            Duration::ZERO
        );
    }
}
