//! [`HandedOutTasks`]: which numbered tasks of an epoch have been handed out to the user, kept
//! small.
//!
//! Tasks are numbered in the order their keys were drawn (the [`crate::Scheduler`] numbers them
//! as it assigns them). In order, the tasks handed out are always a prefix `0..end`; out of
//! order (`in_order=False`) results leave as they arrive, so some tasks below the last one
//! handed out may still be missing. Those "holes" are tasks assigned and not handed out yet,
//! and the scheduler never lets more than `prefetch_factor × num_workers` of those exist: the
//! set stays that small however long the epoch (NOTE [Resume] in python/rloader/_resume/__init__.py).

use std::collections::BTreeSet;

/// The tasks handed out: every task below `end` except the `holes`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HandedOutTasks {
    end: u64,
    holes: BTreeSet<u64>,
}

impl HandedOutTasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// `task` was handed out (again: no change).
    pub fn mark(&mut self, task: u64) {
        if task >= self.end {
            self.holes.extend(self.end..task);
            self.end = task + 1;
        } else {
            self.holes.remove(&task);
        }
    }

    /// One past the highest task handed out (0 before the first).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The tasks below [`HandedOutTasks::end`] not handed out, in increasing order.
    pub fn holes(&self) -> impl Iterator<Item = u64> + '_ {
        self.holes.iter().copied()
    }

    /// How many tasks were handed out.
    pub fn count(&self) -> u64 {
        self.end - self.holes.len() as u64
    }

    pub fn contains(&self, task: u64) -> bool {
        task < self.end && !self.holes.contains(&task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_is_a_prefix() {
        let mut h = HandedOutTasks::new();
        assert_eq!((h.end(), h.count()), (0, 0));
        for t in 0..5 {
            h.mark(t);
        }
        assert_eq!((h.end(), h.count()), (5, 5));
        assert_eq!(h.holes().count(), 0);
    }

    #[test]
    fn out_of_order_leaves_holes_until_filled() {
        let mut h = HandedOutTasks::new();
        h.mark(2);
        assert_eq!(h.holes().collect::<Vec<_>>(), [0, 1]);
        assert_eq!((h.end(), h.count()), (3, 1));
        h.mark(5);
        h.mark(0);
        assert_eq!(h.holes().collect::<Vec<_>>(), [1, 3, 4]);
        assert!(h.contains(0) && !h.contains(1) && h.contains(2) && !h.contains(6));
        for t in [4, 1, 3] {
            h.mark(t);
        }
        assert_eq!((h.end(), h.count()), (6, 6));
        assert_eq!(h.holes().count(), 0);
        h.mark(3); // twice: no change
        assert_eq!((h.end(), h.count()), (6, 6));
    }
}
