//! Mutations of a valid encoding for the decoder fuzz tests (issue 14 part 6), shared by
//! `proto/tests/fuzz_decoders.rs`, `cluster/tests/fuzz_codec.rs` and `journal/tests/fuzz_decoders.rs`:
//! starting from real bytes reaches far deeper into a decoder than noise, which its first check refuses.

use proptest::prelude::*;
use proptest::sample::Index;

/// One change to an encoding: flip bits of a byte, cut the tail, or splice in arbitrary bytes.
#[derive(Clone, Debug)]
pub enum Mutation {
    Flip { at: Index, mask: u8 },
    Truncate { at: Index },
    Insert { at: Index, bytes: Vec<u8> },
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1..=u8::MAX).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        any::<Index>().prop_map(|at| Mutation::Truncate { at }),
        (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
    ]
}

/// One to three mutations.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..4)
}

/// `bytes` with `mutations` applied in order.
pub fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match m {
            Mutation::Flip { at, mask } if len > 0 => bytes[at.index(len)] ^= mask,
            Mutation::Flip { .. } => {}
            Mutation::Truncate { at } => bytes.truncate(at.index(len + 1)),
            Mutation::Insert { at, bytes: extra } => {
                let at = at.index(len + 1);
                bytes.splice(at..at, extra.iter().copied());
            }
        }
    }
    bytes
}
