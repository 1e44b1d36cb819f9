//! The one back-off of a pod worker: a delay that doubles after each attempt up to a ceiling,
//! and starts over after a success. Crashed containers (as the kubelet: at once after the first
//! crash, then 10 s doubling to 5 min), a sandbox that cannot be made, and the final delete of
//! a pod object all use it.

use std::time::Duration;

/// A doubling delay between attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    /// Whether the first attempt after a start or a reset goes at once.
    first_free: bool,
    /// Whether the next attempt is that free one.
    free_next: bool,
}

impl Backoff {
    /// Starts at `initial`, doubles after each attempt, never exceeds `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Self {
            initial,
            max,
            next: initial,
            first_free: false,
            free_next: false,
        }
    }

    /// Like [`Backoff::new`], but the first attempt after a start or a reset has no delay: the
    /// kubelet starts a container again at once after its first crash, and waits from the
    /// second on.
    pub fn first_free(initial: Duration, max: Duration) -> Self {
        Self {
            first_free: true,
            free_next: true,
            ..Self::new(initial, max)
        }
    }

    /// The delay before the next attempt; the one after it will be twice as long (up to the
    /// ceiling).
    pub fn next_delay(&mut self) -> Duration {
        if self.free_next {
            self.free_next = false;
            return Duration::ZERO;
        }
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Starts over from the first delay.
    pub fn reset(&mut self) {
        self.next = self.initial;
        self.free_next = self.first_free;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(b: &mut Backoff, n: usize) -> Vec<u64> {
        (0..n).map(|_| b.next_delay().as_secs()).collect()
    }

    #[test]
    fn doubles_up_to_the_ceiling_and_starts_over_after_a_reset() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(secs(&mut b, 7), vec![10, 20, 40, 80, 160, 300, 300]);
        b.reset();
        assert_eq!(secs(&mut b, 2), vec![10, 20]);
    }

    #[test]
    fn a_first_free_back_off_goes_at_once_first_after_each_reset() {
        let mut b = Backoff::first_free(Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(secs(&mut b, 4), vec![0, 10, 20, 40]);
        b.reset();
        assert_eq!(secs(&mut b, 2), vec![0, 10]);
    }

    #[test]
    fn an_initial_delay_above_the_ceiling_is_capped() {
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(30));
        assert_eq!(secs(&mut b, 2), vec![30, 30]);
    }
}
