//! Random numbers from the operating system: a process's instance id, and the
//! jitter that keeps many workers from doing the same thing at the same moment.

/// 64 random bits from the operating system.
pub(crate) fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    u64::from_le_bytes(bytes)
}

/// A random number in `[0, 1)` (53 bits, as an `f64` holds them).
pub(crate) fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}
