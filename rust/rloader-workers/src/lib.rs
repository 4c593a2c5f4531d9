//! Worker orchestration as torch.utils.data does it, as a pure state machine.
//!
//! The main process of a multi-process DataLoader hands numbered tasks (index batches) to its
//! workers and hands their results to the user. [`Scheduler`] decides, with no I/O of its own:
//! - which worker gets the next task: round-robin over the workers still active, as torch's
//!   `_try_put_index` cycles through them;
//! - whether there is room for another task: at most `prefetch_factor × num_workers` are in
//!   flight;
//! - which result is handed out next: with `in_order`, results leave in task order and early
//!   ones wait in a reorder buffer; without, they leave as they arrive;
//! - when the epoch is over: every task answered and the sampler exhausted.
//!
//! An iterable-style dataset's worker may run out of data: its answer to a task is then
//! "ended" ([`Scheduler::on_worker_ended`]), it gets no more tasks, and results it can no longer
//! produce are skipped.

use std::collections::{BTreeMap, VecDeque};

/// What the consumer should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<T> {
    /// Hand this result out.
    Ready(T),
    /// Wait for a worker to answer.
    Wait,
    /// Every task has been answered and nothing more will be assigned.
    Done,
}

/// A task sent and not yet handed out.
#[derive(Debug)]
struct Task<T> {
    worker: usize,
    result: Option<T>,
}

#[derive(Debug)]
pub struct Scheduler<T> {
    max_in_flight: usize,
    in_order: bool,
    active: Vec<bool>,
    /// The worker the round-robin cycle looks at next.
    cursor: usize,
    /// Tasks numbered by send order; `rcvd` is the next one to hand out in order.
    next_task: u64,
    rcvd: u64,
    /// Sent and not yet answered.
    outstanding: usize,
    /// Sent tasks not handed out yet (in_order: with their results once they arrive;
    /// otherwise only until answered).
    tasks: BTreeMap<u64, Task<T>>,
    /// !in_order: results in arrival order.
    arrived: VecDeque<T>,
    /// The sampler has no more tasks.
    exhausted: bool,
}

impl<T> Scheduler<T> {
    pub fn new(num_workers: usize, prefetch_factor: usize, in_order: bool) -> Self {
        assert!(num_workers > 0, "a scheduler needs at least one worker");
        Scheduler {
            max_in_flight: (prefetch_factor * num_workers).max(1),
            in_order,
            active: vec![true; num_workers],
            cursor: 0,
            next_task: 0,
            rcvd: 0,
            outstanding: 0,
            tasks: BTreeMap::new(),
            arrived: VecDeque::new(),
            exhausted: false,
        }
    }

    /// Whether another task may be sent now (room in flight and a worker to take it).
    pub fn has_room(&self) -> bool {
        !self.exhausted && self.outstanding < self.max_in_flight && self.active.iter().any(|&a| a)
    }

    /// Numbers the next task and picks its worker. Call only after `has_room()`, once a task
    /// is in hand; returns `(worker, task)`.
    pub fn assign(&mut self) -> (usize, u64) {
        let n = self.active.len();
        let worker = (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&w| self.active[w])
            .expect("assign() needs an active worker: check has_room() first");
        self.cursor = (worker + 1) % n;
        let task = self.next_task;
        self.next_task += 1;
        self.outstanding += 1;
        self.tasks.insert(
            task,
            Task {
                worker,
                result: None,
            },
        );
        (worker, task)
    }

    /// The sampler has no more tasks to give.
    pub fn mark_exhausted(&mut self) {
        self.exhausted = true;
    }

    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// A worker answered `task` with `result`.
    pub fn on_result(&mut self, task: u64, result: T) {
        self.outstanding = self.outstanding.saturating_sub(1);
        if !self.in_order {
            self.tasks.remove(&task);
            self.arrived.push_back(result);
        } else if let Some(t) = self.tasks.get_mut(&task) {
            t.result = Some(result);
        }
    }

    /// A worker answered `task` with "my dataset is exhausted": it gets no more tasks, and its
    /// other unanswered tasks will never be answered.
    pub fn on_worker_ended(&mut self, worker: usize, task: u64) {
        self.outstanding = self.outstanding.saturating_sub(1);
        if let Some(flag) = self.active.get_mut(worker) {
            *flag = false;
        }
        self.tasks.remove(&task);
        // Tasks still queued at that worker are dropped by it unanswered.
        let lost: Vec<u64> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.worker == worker && t.result.is_none())
            .map(|(&k, _)| k)
            .collect();
        for k in lost {
            self.tasks.remove(&k);
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        if !self.active.iter().any(|&a| a) {
            self.exhausted = true;
        }
    }

    /// Whether `worker` has a task it has not answered yet.
    pub fn owes(&self, worker: usize) -> bool {
        self.tasks
            .values()
            .any(|t| t.worker == worker && t.result.is_none())
    }

    pub fn is_active(&self, worker: usize) -> bool {
        self.active.get(worker).copied().unwrap_or(false)
    }

    /// Unanswered tasks.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// What to hand out next. Send every task there is room for (`has_room`/`assign`) before
    /// asking: `Wait` means a worker owes an answer.
    #[allow(clippy::should_implement_trait)] // not an Iterator: Wait is not the end
    pub fn next(&mut self) -> Next<T> {
        if !self.in_order {
            if let Some(r) = self.arrived.pop_front() {
                return Next::Ready(r);
            }
        } else {
            if let Some(entry) = self.tasks.first_entry() {
                if entry.get().result.is_some() {
                    let task = entry.remove();
                    self.rcvd += 1;
                    return Next::Ready(task.result.expect("checked above"));
                }
            }
        }
        if self.outstanding == 0 && (self.exhausted || !self.active.iter().any(|&a| a)) {
            Next::Done
        } else {
            Next::Wait
        }
    }

    /// Begins a new epoch with every worker active again (persistent workers).
    pub fn reset(&mut self) {
        self.active.iter_mut().for_each(|a| *a = true);
        self.cursor = 0;
        self.next_task = 0;
        self.rcvd = 0;
        self.outstanding = 0;
        self.tasks.clear();
        self.arrived.clear();
        self.exhausted = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs an epoch with instant workers that answer in the given arrival order permutation
    /// and returns the order in which results were handed out.
    fn run(
        num_workers: usize,
        prefetch: usize,
        in_order: bool,
        tasks: u64,
        reverse: bool,
    ) -> Vec<u64> {
        let mut s = Scheduler::new(num_workers, prefetch, in_order);
        let mut next_index = 0;
        let mut out = Vec::new();
        let mut inbox: Vec<(usize, u64)> = Vec::new();
        loop {
            while s.has_room() {
                if next_index == tasks {
                    s.mark_exhausted();
                    break;
                }
                next_index += 1;
                inbox.push(s.assign());
            }
            match s.next() {
                Next::Ready(r) => out.push(r),
                Next::Done => break,
                Next::Wait => {
                    let (_, task) = if reverse {
                        inbox.pop().unwrap()
                    } else {
                        inbox.remove(0)
                    };
                    s.on_result(task, task);
                }
            }
        }
        out
    }

    #[test]
    fn round_robin_assignment() {
        let mut s: Scheduler<()> = Scheduler::new(3, 2, true);
        let workers: Vec<usize> = (0..6).map(|_| s.assign().0).collect();
        assert_eq!(workers, [0, 1, 2, 0, 1, 2]);
        assert!(!s.has_room(), "6 = prefetch 2 x 3 workers in flight");
    }

    #[test]
    fn in_order_hands_out_in_task_order_whatever_the_arrival() {
        for reverse in [false, true] {
            assert_eq!(run(2, 2, true, 10, reverse), (0..10).collect::<Vec<_>>());
        }
    }

    #[test]
    fn out_of_order_hands_out_as_results_arrive() {
        let out = run(2, 2, false, 10, true);
        let mut sorted = out.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(out, sorted);
    }

    #[test]
    fn ended_workers_get_no_more_tasks() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 2, true);
        let a = s.assign(); // (0, 0)
        let b = s.assign(); // (1, 1)
        let c = s.assign(); // (0, 2)
        assert_eq!((a, b, c), ((0, 0), (1, 1), (0, 2)));
        s.on_worker_ended(0, 0);
        // Worker 0 drops task 2 unanswered; only worker 1 is left.
        assert_eq!(s.outstanding(), 1);
        assert_eq!(s.assign(), (1, 3));
        s.on_result(1, 11);
        assert_eq!(s.next(), Next::Ready(11));
        s.on_worker_ended(1, 3);
        assert_eq!(s.next(), Next::Done);
    }

    #[test]
    fn ended_workers_out_of_order() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 2, false);
        let _ = (s.assign(), s.assign(), s.assign(), s.assign()); // tasks 0..4 on workers 0,1,0,1
        s.on_result(1, 1);
        s.on_worker_ended(0, 0); // worker 0 drops task 2
        s.on_result(3, 3);
        assert_eq!(s.next(), Next::Ready(1));
        assert_eq!(s.next(), Next::Ready(3));
        assert_eq!(s.outstanding(), 0);
        assert!(s.has_room());
        s.mark_exhausted();
        assert_eq!(s.next(), Next::Done);
    }

    #[test]
    fn empty_epoch_is_done() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 2, true);
        s.mark_exhausted();
        assert_eq!(s.next(), Next::Done);
    }

    #[test]
    fn reset_starts_a_new_epoch() {
        let mut s: Scheduler<u64> = Scheduler::new(1, 1, true);
        s.assign();
        s.on_worker_ended(0, 0);
        assert!(!s.has_room());
        s.reset();
        assert!(s.has_room());
        assert_eq!(s.assign(), (0, 0));
    }

    #[test]
    fn owes_tracks_unanswered_tasks_per_worker() {
        for in_order in [true, false] {
            let mut s: Scheduler<u64> = Scheduler::new(2, 1, in_order);
            let (w0, t0) = s.assign();
            let (w1, t1) = s.assign();
            assert_eq!((w0, w1), (0, 1));
            assert!(s.owes(0) && s.owes(1));
            s.on_result(t1, t1);
            assert!(s.owes(0) && !s.owes(1), "in_order={in_order}");
            s.on_result(t0, t0);
            assert!(!s.owes(0));
            // Answered but not yet handed out is not owed.
            assert!(matches!(s.next(), Next::Ready(_)));
            assert!(!s.owes(0) && !s.owes(1));
        }
    }
}
