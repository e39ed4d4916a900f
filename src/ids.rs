//! Ids courier makes (an event without one, a batch): UUIDv7, the
//! millisecond clock then 74 random bits from the thread's CSPRNG
//! (`rand::rng()`, seeded from the OS). `Uuid::now_v7` asks the kernel
//! (getrandom) for every id and takes a process-wide lock for ordering
//! within a millisecond: CPU spent under load (benches/RESULTS.md) for an order
//! nothing relies on (the journal orders events by its own sequence).

use rand::Rng;

pub fn new() -> String {
    let random: [u8; 10] = rand::rng().random();
    uuid::Builder::from_unix_timestamp_millis(crate::clock::now_ms(), &random)
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_uuid7_of_now_and_differ() {
        let before = crate::clock::now_ms();
        let (a, b) = (super::new(), super::new());
        let after = crate::clock::now_ms();
        assert_ne!(a, b);
        for id in [a, b] {
            let u = uuid::Uuid::parse_str(&id).expect("a uuid");
            assert_eq!(u.get_version_num(), 7, "{id}");
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122, "{id}");
            let (secs, nanos) = u.get_timestamp().expect("v7 has a time").to_unix();
            let ms = secs * 1000 + u64::from(nanos) / 1_000_000;
            assert!(
                (before..=after).contains(&ms),
                "{id}: {ms} not in {before}..={after}"
            );
        }
    }
}
