//! What every fault run shares: how many rounds it makes (`make test` a few, `make chaos`
//! hundreds, from an environment variable) and the random choices it makes, from a seed that
//! is printed so that a run can be repeated (`NOOPS_CHAOS_SEED`).

/// The rounds a fault run makes: the variable `var` if set, else `default`.
pub fn rounds(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A small deterministic random sequence (xorshift).
pub struct Dice(u64);

impl Dice {
    /// Dice from `NOOPS_CHAOS_SEED`, or from the clock; the seed is printed.
    pub fn from_env() -> Self {
        let seed = std::env::var("NOOPS_CHAOS_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| jiff::Timestamp::now().as_nanosecond() as u64 | 1);
        println!("chaos: seed {seed} (NOOPS_CHAOS_SEED repeats this run)");
        Self(seed)
    }

    /// A number in `0..sides`.
    pub fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides.max(1)
    }
}
