//! `--power N` (ds4, ds4-bench, ds4-server): a duty-cycle target in percent. After each unit of work (a decoded token, a
//! prefill chunk) that took `w` seconds, sleep `w·(100−N)/N`, so the device is busy about N % of the
//! time. Output is unchanged; only speed drops.
use std::time::{Duration, Instant};

pub struct Power {
    pct: u32,
    since: Instant,
}

impl Power {
    /// `pct` in 1..=100 (100 = no sleeps).
    pub fn new(pct: u32) -> Result<Self, String> {
        if !(1..=100).contains(&pct) {
            return Err(format!("--power {pct}: expected a percentage from 1 to 100"));
        }
        Ok(Self { pct, since: Instant::now() })
    }

    /// No sleeps (100 %).
    pub fn full() -> Self { Self { pct: 100, since: Instant::now() } }

    /// The sleep owed after `work` of busy time.
    pub fn pause_for(&self, work: Duration) -> Duration { work * (100 - self.pct) / self.pct }

    /// Marks the start of a unit of work (e.g. after waiting for input).
    pub fn restart(&mut self) { self.since = Instant::now(); }

    /// Ends a unit of work: sleeps its share, then starts the next unit.
    pub fn tick(&mut self) {
        if self.pct < 100 {
            std::thread::sleep(self.pause_for(self.since.elapsed()));
        }
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duty_cycle() {
        assert!(Power::new(0).is_err() && Power::new(101).is_err());
        let p = Power::new(25).unwrap();
        assert_eq!(p.pause_for(Duration::from_millis(10)), Duration::from_millis(30), "busy 10 of 40 ms");
        assert_eq!(Power::new(100).unwrap().pause_for(Duration::from_secs(1)), Duration::ZERO);
    }
}
