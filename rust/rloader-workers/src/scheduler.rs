//! `Scheduler`: which task goes to which worker and which result is handed out next, as
//! torch.utils.data decides it, as a pure state machine.
//!
//! The main process of a multi-process DataLoader hands numbered tasks (index batches) to its
//! workers and hands their results to the user. [`Scheduler`] decides, with no I/O of its own,
//! as torch's `_MultiProcessingDataLoaderIter` does:
//! - when to draw the next task from the sampler ([`Scheduler::draws_owed`]):
//!   `prefetch_factor × num_workers` draws at the start of an epoch, then one for each result
//!   handed out and one for each worker whose dataset ended (torch's `_try_put_index` calls), so
//!   tasks drawn and not handed out never exceed `prefetch_factor × num_workers`;
//! - which worker gets it: round-robin over the workers still active; with `in_order=False`,
//!   skipping workers that already hold their share of that bound (`prefetch_factor ×
//!   num_workers / active workers` tasks not handed out), so that one slow worker does not hold
//!   up the others;
//! - which result is handed out next: with `in_order`, results leave in task order and early
//!   ones wait in a reorder buffer; without, they leave as they arrive;
//! - when the epoch is over: every task answered and the sampler exhausted, or nothing in
//!   flight and no draw owed (after a sampler's error), where torch ends it too.
//!
//! The bound may change during an epoch ([`Scheduler::set_prefetch_factor`]: the tuning of
//! `prefetch_factor="auto"`). A hand-out (or a worker's end) owes a draw only while the tasks
//! drawn and not handed out and the draws owed are below the bound: with a fixed bound that is
//! always (torch's account: `in flight + owed = bound`, less the tasks lost with a worker whose
//! dataset ended); raised, the difference is owed at once; lowered, hand-outs owe nothing until
//! the tasks in flight are within it. With nothing in flight a draw is always owed, so a
//! change never ends an epoch.
//!
//! It also says which task (and worker) each result handed out answered
//! ([`Scheduler::last_handed_out`]): a resumable position, out of order too
//! ([`crate::HandedOutTasks`]).
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
    /// Tasks numbered by assignment order.
    next_task: u64,
    /// Assigned and not yet answered.
    outstanding: usize,
    /// Per worker, tasks assigned and not handed out (torch's `_workers_num_tasks`).
    held: Vec<usize>,
    /// Draws of the sampler owed before the next hand-out.
    owed: usize,
    /// Assigned tasks not handed out yet (in_order: with their results once they arrive;
    /// otherwise only until answered).
    tasks: BTreeMap<u64, Task<T>>,
    /// !in_order: (worker, task, result) in arrival order.
    arrived: VecDeque<(usize, u64, T)>,
    /// (worker, task) of the result `next` handed out last.
    last: Option<(usize, u64)>,
    /// The sampler has no more tasks.
    exhausted: bool,
}

impl<T> Scheduler<T> {
    pub fn new(num_workers: usize, prefetch_factor: usize, in_order: bool) -> Self {
        assert!(num_workers > 0, "a scheduler needs at least one worker");
        let max_in_flight = (prefetch_factor * num_workers).max(1);
        Scheduler {
            max_in_flight,
            in_order,
            active: vec![true; num_workers],
            cursor: 0,
            next_task: 0,
            outstanding: 0,
            held: vec![0; num_workers],
            owed: max_in_flight,
            tasks: BTreeMap::new(),
            arrived: VecDeque::new(),
            last: None,
            exhausted: false,
        }
    }

    /// Starts the round robin at `worker` instead of worker 0: a resumed epoch of an iterable
    /// dataset goes on with the worker whose batch came next (each worker resumes its own
    /// dataset's stream, so the rest of the cycle is the uninterrupted one's).
    pub fn start_at(&mut self, worker: usize) {
        self.cursor = worker % self.active.len();
    }

    /// `(worker, task)` of the last result [`Scheduler::next`] handed out (None before the
    /// first of an epoch).
    pub fn last_handed_out(&self) -> Option<(usize, u64)> {
        self.last
    }

    /// How many draws of the sampler are owed now: each is made (or tried: a draw that fails
    /// counts too) with [`Scheduler::spend_draw`], and a task drawn goes to
    /// [`Scheduler::assign`].
    pub fn draws_owed(&self) -> usize {
        if self.exhausted || !self.active.iter().any(|&a| a) {
            0
        } else {
            self.owed
        }
    }

    pub fn spend_draw(&mut self) {
        self.owed = self.owed.saturating_sub(1);
    }

    /// Tasks drawn and not handed out (answered or not).
    fn in_flight(&self) -> usize {
        self.tasks.len() + self.arrived.len()
    }

    /// One more draw owed (a hand-out, a worker's end), while below the bound (see the module).
    fn owe_one(&mut self) {
        if self.in_flight() + self.owed < self.max_in_flight {
            self.owed += 1;
        }
    }

    /// Bounds the tasks drawn and not handed out to `prefetch_factor` per worker from now on
    /// (see the module): what fills the new bound is owed.
    pub fn set_prefetch_factor(&mut self, prefetch_factor: usize) {
        self.max_in_flight = (prefetch_factor * self.active.len()).max(1);
        self.owed = self.max_in_flight.saturating_sub(self.in_flight());
    }

    /// The bound on tasks drawn and not handed out.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Whether [`Scheduler::assign`] would find a worker for a task now.
    pub fn can_assign(&self) -> bool {
        let cap = self.worker_cap();
        (0..self.active.len()).any(|w| self.takes(w, cap))
    }

    /// Numbers a drawn task and picks its worker: `(worker, task)`, or None when no worker may
    /// take it (all ended or, out of order, all at their share), in which case the task is
    /// dropped, as torch drops it.
    pub fn assign(&mut self) -> Option<(usize, u64)> {
        let n = self.active.len();
        let cap = self.worker_cap();
        for _ in 0..n {
            let worker = self.cursor;
            self.cursor = (worker + 1) % n;
            if !self.takes(worker, cap) {
                continue;
            }
            let task = self.next_task;
            self.next_task += 1;
            self.outstanding += 1;
            self.held[worker] += 1;
            self.tasks.insert(
                task,
                Task {
                    worker,
                    result: None,
                },
            );
            return Some((worker, task));
        }
        None
    }

    /// Out of order, a worker's share of the tasks not handed out.
    fn worker_cap(&self) -> usize {
        let active = self.active.iter().filter(|&&a| a).count().max(1);
        self.max_in_flight / active
    }

    fn takes(&self, worker: usize, cap: usize) -> bool {
        self.active[worker] && (self.in_order || self.held[worker] < cap)
    }

    /// The sampler has no more tasks to give.
    pub fn mark_exhausted(&mut self) {
        self.exhausted = true;
    }

    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// A worker answered `task` with `result`. Only an answer to a task this scheduler sent and
    /// has no answer for counts: another (a task of an abandoned epoch, a second answer) is
    /// dropped and changes nothing, so it cannot end the epoch before its tasks are answered.
    pub fn on_result(&mut self, task: u64, result: T) {
        if !self.in_order {
            if let Some(t) = self.tasks.remove(&task) {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.arrived.push_back((t.worker, task, result));
            }
        } else if let Some(t) = self.tasks.get_mut(&task) {
            if t.result.is_none() {
                self.outstanding = self.outstanding.saturating_sub(1);
                t.result = Some(result);
            }
        }
    }

    /// A worker answered `task` with "my dataset is exhausted": it gets no more tasks, its
    /// other unanswered tasks will never be answered, and one more draw is owed.
    pub fn on_worker_ended(&mut self, worker: usize, task: u64) {
        if self.tasks.get(&task).is_some_and(|t| t.result.is_none()) {
            self.tasks.remove(&task);
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        self.owe_one();
        if let Some(flag) = self.active.get_mut(worker) {
            *flag = false;
        }
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
        self.unanswered(worker) > 0
    }

    /// How many tasks `worker` has not answered yet.
    pub fn unanswered(&self, worker: usize) -> usize {
        self.tasks
            .values()
            .filter(|t| t.worker == worker && t.result.is_none())
            .count()
    }

    pub fn is_active(&self, worker: usize) -> bool {
        self.active.get(worker).copied().unwrap_or(false)
    }

    /// The worker whose answer is handed out next, in order: the one that holds the oldest
    /// task not handed out, if it has not answered it (None out of order, where any answer
    /// may be next, and when no task waits for an answer).
    pub fn awaited_worker(&self) -> Option<usize> {
        if !self.in_order {
            return None;
        }
        let (_, first) = self.tasks.first_key_value()?;
        first.result.is_none().then_some(first.worker)
    }

    /// Whether the answer waited for may come from the first `started` workers (the others
    /// are not started yet: NOTE [Staged start] in rloader-py's process/pool/start.rs, NOTE
    /// [Thread start] in its threads/mod.rs): in order, the awaited worker is one of them; out
    /// of order (or with no task awaited), one of them owes an answer.
    pub fn answer_coming_from(&self, started: usize) -> bool {
        match self.awaited_worker() {
            Some(w) => w < started,
            None => (0..started).any(|w| self.owes(w)),
        }
    }

    /// Unanswered tasks.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// What to hand out next. Make the draws owed (`draws_owed`/`assign`) before asking:
    /// `Wait` means a worker owes an answer. Handing a result out owes one more draw, to be
    /// made before the result reaches the user (torch's `_process_data`).
    #[allow(clippy::should_implement_trait)] // not an Iterator: Wait is not the end
    pub fn next(&mut self) -> Next<T> {
        let ready = if !self.in_order {
            self.arrived.pop_front()
        } else {
            match self.tasks.first_entry() {
                Some(entry) if entry.get().result.is_some() => {
                    let (number, task) = entry.remove_entry();
                    task.result.map(|r| (task.worker, number, r))
                }
                _ => None,
            }
        };
        if let Some((worker, task, result)) = ready {
            self.last = Some((worker, task));
            self.held[worker] = self.held[worker].saturating_sub(1);
            self.owe_one();
            return Next::Ready(result);
        }
        if self.outstanding == 0 && (self.exhausted || self.draws_owed() == 0) {
            Next::Done
        } else {
            Next::Wait
        }
    }

    /// The results received and not handed out yet.
    pub fn results(&self) -> impl Iterator<Item = &T> {
        let ordered = self.tasks.values().filter_map(|t| t.result.as_ref());
        ordered.chain(self.arrived.iter().map(|(_, _, r)| r))
    }

    /// Begins a new epoch with every worker active again (persistent workers).
    pub fn reset(&mut self) {
        self.active.iter_mut().for_each(|a| *a = true);
        self.cursor = 0;
        self.next_task = 0;
        self.outstanding = 0;
        self.held.iter_mut().for_each(|h| *h = 0);
        self.owed = self.max_in_flight;
        self.tasks.clear();
        self.arrived.clear();
        self.last = None;
        self.exhausted = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_awaited_worker_is_the_one_holding_the_oldest_task() {
        let mut s: Scheduler<u32> = Scheduler::new(3, 2, true);
        assert_eq!(s.awaited_worker(), None, "no task yet");
        let tasks: Vec<_> = (0..6).map(|_| s.assign().unwrap()).collect();
        assert_eq!(tasks[..3], [(0, 0), (1, 1), (2, 2)]);
        assert_eq!(s.awaited_worker(), Some(0));
        s.on_result(1, 10); // worker 1 answers early: worker 0 is still awaited
        assert_eq!(s.awaited_worker(), Some(0));
        s.on_result(0, 9);
        assert_eq!(
            s.awaited_worker(),
            None,
            "the oldest task is answered: hand it out"
        );
        assert_eq!(s.next(), Next::Ready(9));
        assert_eq!(s.next(), Next::Ready(10));
        assert_eq!(s.awaited_worker(), Some(2));
        let unordered: Scheduler<u32> = Scheduler::new(3, 2, false);
        assert_eq!(
            unordered.awaited_worker(),
            None,
            "out of order any answer may come next"
        );
    }

    #[test]
    fn an_answer_is_coming_only_from_a_started_worker_that_owes_it() {
        let mut s: Scheduler<u32> = Scheduler::new(3, 1, true);
        assert!(!s.answer_coming_from(3), "no task: nothing is coming");
        for _ in 0..3 {
            s.assign().unwrap();
        }
        assert!(
            s.answer_coming_from(1),
            "worker 0's answer is awaited, and it runs"
        );
        assert!(!s.answer_coming_from(0));
        s.on_result(0, 7);
        assert_eq!(s.next(), Next::Ready(7));
        assert!(
            !s.answer_coming_from(1),
            "worker 1's is awaited: it must start"
        );
        assert!(s.answer_coming_from(2));
        let mut unordered: Scheduler<u32> = Scheduler::new(3, 1, false);
        for _ in 0..3 {
            unordered.assign().unwrap();
        }
        assert!(
            unordered.answer_coming_from(1),
            "out of order: worker 0 owes one"
        );
        unordered.on_result(0, 1);
        assert!(
            !unordered.answer_coming_from(1),
            "worker 0 owes nothing more"
        );
        assert!(unordered.answer_coming_from(2));
    }

    /// Runs an epoch with instant workers that answer in the given arrival order permutation
    /// and returns the order in which results were handed out.
    fn run(
        num_workers: usize,
        prefetch: usize,
        in_order: bool,
        tasks: u64,
        reverse: bool,
    ) -> Vec<u64> {
        let pick = |n: usize| if reverse { n - 1 } else { 0 };
        let (out, _, _) = handed_out(num_workers, prefetch, in_order, tasks, pick);
        out.into_iter().map(|(_, task)| task).collect()
    }

    #[test]
    fn round_robin_assignment() {
        let mut s: Scheduler<()> = Scheduler::new(3, 2, true);
        assert_eq!(s.draws_owed(), 6, "prefetch 2 x 3 workers");
        let workers: Vec<usize> = (0..6).map(|_| s.assign().unwrap().0).collect();
        assert_eq!(workers, [0, 1, 2, 0, 1, 2]);
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
        assert_eq!((a, b, c), (Some((0, 0)), Some((1, 1)), Some((0, 2))));
        s.on_worker_ended(0, 0);
        // Worker 0 drops task 2 unanswered; only worker 1 is left.
        assert_eq!(s.outstanding(), 1);
        assert_eq!(s.assign(), Some((1, 3)));
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
        assert!(s.can_assign());
        s.mark_exhausted();
        assert_eq!(s.next(), Next::Done);
    }

    #[test]
    fn answers_to_unknown_or_answered_tasks_change_nothing() {
        for in_order in [true, false] {
            let mut s: Scheduler<u64> = Scheduler::new(2, 1, in_order);
            let _ = (s.assign(), s.assign()); // task 0 on worker 0, task 1 on worker 1
            s.on_result(0, 10);
            s.on_result(0, 99); // a second answer
            s.on_result(7, 77); // a task never sent (an abandoned epoch's)
            s.on_worker_ended(0, 9); // worker 0 ends answering a task never sent
            assert_eq!(s.outstanding(), 1, "in_order {in_order}");
            s.mark_exhausted();
            assert_eq!(s.next(), Next::Ready(10));
            assert_eq!(s.next(), Next::Wait, "task 1 is still owed");
            s.on_result(1, 11);
            assert_eq!(s.next(), Next::Ready(11));
            assert_eq!(s.next(), Next::Done);
        }
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
        assert!(!s.can_assign());
        assert_eq!(s.draws_owed(), 0);
        s.reset();
        assert!(s.can_assign());
        assert_eq!(s.draws_owed(), 1);
        assert_eq!(s.assign(), Some((0, 0)));
    }

    #[test]
    fn owes_tracks_unanswered_tasks_per_worker() {
        for in_order in [true, false] {
            let mut s: Scheduler<u64> = Scheduler::new(2, 1, in_order);
            let (w0, t0) = s.assign().unwrap();
            let (w1, t1) = s.assign().unwrap();
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

    #[test]
    fn draws_are_owed_as_torch_puts_indices() {
        // prefetch 3 x 2 workers up front, then one per hand-out, whatever arrived meanwhile.
        let mut s: Scheduler<u64> = Scheduler::new(2, 3, true);
        assert_eq!(s.draws_owed(), 6);
        let tasks: Vec<u64> = (0..6)
            .map(|_| {
                s.spend_draw();
                s.assign().unwrap().1
            })
            .collect();
        assert_eq!(s.draws_owed(), 0);
        for &t in tasks.iter().rev() {
            s.on_result(t, t); // every answer in, out of order: still nothing owed
        }
        assert_eq!(s.draws_owed(), 0);
        assert_eq!(s.next(), Next::Ready(0));
        assert_eq!(s.draws_owed(), 1);
        assert_eq!(s.next(), Next::Ready(1));
        assert_eq!(s.draws_owed(), 2);
    }

    #[test]
    fn nothing_in_flight_and_nothing_owed_ends_the_epoch() {
        // A sampler that fails its draw: the draw is spent, and once every task is handed out
        // the epoch is over (torch raises StopIteration there), not a wait.
        let mut s: Scheduler<u64> = Scheduler::new(1, 1, true);
        s.spend_draw();
        let (_, t) = s.assign().unwrap();
        s.on_result(t, 7);
        assert_eq!(s.next(), Next::Ready(7));
        assert_eq!(s.draws_owed(), 1);
        s.spend_draw(); // the draw raised
        assert_eq!(s.next(), Next::Done);
    }

    #[test]
    fn ended_worker_owes_a_draw() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 1, true);
        for _ in 0..2 {
            s.spend_draw();
            s.assign();
        }
        s.on_worker_ended(0, 0);
        assert_eq!(s.draws_owed(), 1);
    }

    #[test]
    fn out_of_order_skips_workers_holding_their_share() {
        // torch: with in_order=False a task goes to the next active worker holding fewer than
        // prefetch*workers/active tasks not handed out; a slow worker does not hold up others.
        let mut s: Scheduler<u64> = Scheduler::new(2, 2, false);
        let first: Vec<(usize, u64)> = (0..4).map(|_| s.assign().unwrap()).collect();
        assert_eq!(first, [(0, 0), (1, 1), (0, 2), (1, 3)]);
        // Worker 1 answers both of its tasks; worker 0 is slow.
        s.on_result(1, 1);
        s.on_result(3, 3);
        assert_eq!(s.next(), Next::Ready(1));
        // Worker 0 still holds 2 (its share): the next task skips it.
        assert!(s.can_assign());
        assert_eq!(s.assign(), Some((1, 4)));
        assert_eq!(s.next(), Next::Ready(3));
        assert_eq!(s.assign(), Some((1, 5)));
        assert_eq!(s.unanswered(0), 2);
        assert_eq!(s.unanswered(1), 2);
        assert!(!s.can_assign());
        assert_eq!(
            s.assign(),
            None,
            "every worker at its share: dropped, as torch drops it"
        );
    }

    /// An epoch of `tasks` tasks whose answers arrive in an order picked by `pick` (from the
    /// inbox's length), each result being its task's number; returns what `last_handed_out`
    /// reported for each hand-out, and the largest number of holes seen (see `HandedOutTasks`).
    fn handed_out(
        num_workers: usize,
        prefetch: usize,
        in_order: bool,
        tasks: u64,
        mut pick: impl FnMut(usize) -> usize,
    ) -> (Vec<(usize, u64)>, usize, crate::HandedOutTasks) {
        let mut s = Scheduler::new(num_workers, prefetch, in_order);
        let (mut drawn, mut inbox, mut out) = (0, Vec::new(), Vec::new());
        let mut handed = crate::HandedOutTasks::new();
        let mut most_holes = 0;
        loop {
            while s.draws_owed() > 0 {
                s.spend_draw();
                if drawn == tasks {
                    s.mark_exhausted();
                    break;
                }
                drawn += 1;
                inbox.push(s.assign().unwrap());
            }
            match s.next() {
                Next::Ready(r) => {
                    let (worker, task) = s.last_handed_out().unwrap();
                    assert_eq!(task, r, "the task whose result this is");
                    out.push((worker, task));
                    handed.mark(task);
                    most_holes = most_holes.max(handed.holes().count());
                }
                Next::Done => break,
                Next::Wait => {
                    let (_, task) = inbox.remove(pick(inbox.len()));
                    s.on_result(task, task);
                }
            }
        }
        (out, most_holes, handed)
    }

    #[test]
    fn reports_the_task_and_worker_of_each_hand_out() {
        let (out, holes, handed) = handed_out(3, 2, true, 10, |n| n - 1);
        let expected: Vec<(usize, u64)> = (0..10).map(|t| ((t % 3) as usize, t)).collect();
        assert_eq!(out, expected);
        assert_eq!((holes, handed.end(), handed.count()), (0, 10, 10));
    }

    #[test]
    fn out_of_order_holes_stay_within_the_prefetch_bound() {
        // Answers in a scrambled order: the tasks handed out are not a prefix, but those
        // missing below the last one never outnumber the tasks in flight.
        for (workers, prefetch) in [(1, 1), (2, 2), (3, 2), (4, 3)] {
            let mut state = 12345u64;
            let (out, holes, handed) = handed_out(workers, prefetch, false, 200, |n| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as usize % n
            });
            let mut tasks: Vec<u64> = out.iter().map(|&(_, t)| t).collect();
            assert!(
                workers == 1 || tasks.windows(2).any(|w| w[0] > w[1]),
                "out of order"
            );
            assert!(holes <= workers * prefetch, "{holes} holes");
            assert!(
                workers == 1 || holes > 0,
                "some tasks were left behind for a while"
            );
            assert_eq!((handed.end(), handed.count()), (200, 200));
            tasks.sort_unstable();
            assert_eq!(tasks, (0..200).collect::<Vec<_>>());
        }
    }

    #[test]
    fn start_at_begins_the_round_robin_there() {
        let mut s: Scheduler<u64> = Scheduler::new(3, 1, true);
        s.start_at(2);
        let workers: Vec<usize> = (0..4).map(|_| s.assign().unwrap().0).collect();
        assert_eq!(workers, [2, 0, 1, 2]);
        s.reset();
        assert_eq!(s.assign(), Some((0, 0)), "a new epoch starts at worker 0");
        assert_eq!(s.last_handed_out(), None);
    }

    #[test]
    fn in_order_is_plain_round_robin() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 2, true);
        let first: Vec<(usize, u64)> = (0..4).map(|_| s.assign().unwrap()).collect();
        s.on_result(1, 1);
        s.on_result(3, 3);
        assert_eq!(first[0], (0, 0));
        // Results of worker 1 wait for task 0; the round robin goes on regardless.
        assert_eq!(s.assign(), Some((0, 4)));
    }

    /// Drives `s` as the pools do: makes the draws owed, then hands out what is ready, every
    /// task answered at once; returns the most tasks drawn and not handed out at any time.
    fn drive(s: &mut Scheduler<u64>, hand_outs: usize) -> usize {
        let mut most = 0;
        for _ in 0..hand_outs {
            while s.draws_owed() > 0 {
                s.spend_draw();
                let (_, task) = s.assign().expect("a worker");
                s.on_result(task, task);
            }
            most = most.max(s.tasks.len() + s.arrived.len());
            assert!(matches!(s.next(), Next::Ready(_)));
        }
        most
    }

    #[test]
    fn a_raised_prefetch_factor_is_owed_at_once_and_a_lowered_one_owes_nothing_above_it() {
        let mut s: Scheduler<u64> = Scheduler::new(2, 2, true);
        assert_eq!(drive(&mut s, 3), 4);
        s.set_prefetch_factor(5);
        assert_eq!(s.max_in_flight(), 10);
        assert_eq!(
            s.draws_owed(),
            1 + 6,
            "the hand-out's draw and the difference"
        );
        assert_eq!(drive(&mut s, 5), 10);
        s.set_prefetch_factor(1);
        assert_eq!(s.draws_owed(), 0, "above the new bound: nothing owed");
        // 9 in flight, bound 2: the next 7 hand-outs owe nothing, then one each.
        for _ in 0..7 {
            assert!(matches!(s.next(), Next::Ready(_)));
            assert_eq!(s.draws_owed(), 0);
        }
        assert!(matches!(s.next(), Next::Ready(_)));
        assert_eq!(s.draws_owed(), 1);
        assert_eq!(drive(&mut s, 20), 2, "within the new bound");
        s.set_prefetch_factor(3);
        s.set_prefetch_factor(2);
        assert_eq!(drive(&mut s, 20), 4, "up and down again: the net change");
        s.reset();
        assert_eq!(s.draws_owed(), 4, "a new epoch starts at the bound");
    }

    #[test]
    fn a_lowered_bound_never_ends_the_epoch_of_a_worker_still_active() {
        // 2 workers, prefetch 8 then 2: 16 in flight against a bound of 4. Worker 0's dataset ends with 7 of
        // its tasks unanswered; worker 1's 8 are handed out. Worker 1 still has data: the
        // epoch goes on.
        let mut s: Scheduler<u64> = Scheduler::new(2, 8, true);
        let mut mine = Vec::new();
        while s.draws_owed() > 0 {
            s.spend_draw();
            mine.push(s.assign().expect("a worker"));
        }
        assert_eq!(mine.len(), 16);
        s.set_prefetch_factor(2);
        let (ended, first) = mine[0];
        assert_eq!(ended, 0);
        s.on_worker_ended(0, first);
        for &(worker, task) in &mine {
            if worker == 1 {
                s.on_result(task, task);
            }
        }
        let mut handed = 0;
        loop {
            match s.next() {
                Next::Ready(_) => handed += 1,
                Next::Wait => break,
                Next::Done => panic!("ended with worker 1 active, after {handed} hand-outs"),
            }
            while s.draws_owed() > 0 {
                s.spend_draw();
                let (worker, task) = s.assign().expect("worker 1");
                assert_eq!(worker, 1);
                s.on_result(task, task);
            }
            if handed > 40 {
                break;
            }
        }
        assert!(handed > 8, "worker 1 went on: {handed}");
        s.mark_exhausted();
        while let Next::Ready(_) = s.next() {}
        assert_eq!(s.next(), Next::Done);
    }
}
