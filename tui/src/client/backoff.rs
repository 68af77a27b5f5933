//! Reconnect delays: exponential from `initial` to `max`, reset after a successful connection.
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(250), Duration::from_secs(5))
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            next: initial,
            attempts: 0,
        }
    }

    /// The delay before the next attempt; each call doubles the following one, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        self.attempts += 1;
        delay
    }

    /// Failed attempts since the last success.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub fn reset(&mut self) {
        self.next = self.initial;
        self.attempts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset_after_success() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let delays: Vec<u128> = (0..5).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 700, 700]);
        assert_eq!(backoff.attempts(), 5);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
        assert_eq!(backoff.attempts(), 1);
    }
}
