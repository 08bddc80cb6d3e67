//! Which upstream a session tries first, and which next when a dial fails.
//!
//! Rules (pure: the caller passes each upstream's priority, weight and
//! whether its breaker lets a dial go now):
//! - only upstreams whose breaker allows a dial are candidates;
//! - the best (lowest) priority among them serves; within it, the first
//!   candidate is picked by smooth weighted round-robin (nginx's: every pick
//!   adds each weight to its upstream's running score, picks the highest and
//!   takes the total off it), which is deterministic and spreads picks evenly
//!   (weights 3:1 give A A B A, A A B A, …);
//! - failover goes on to the rest of that priority, heaviest first, then to
//!   the next priorities in order, heaviest first within each.
//!
//! Round-robin state changes only when a pick is made, so a test can predict
//! every choice.

/// One upstream as the selector sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub priority: u32,
    pub weight: u32,
    /// Its breaker lets a dial go now.
    pub available: bool,
}

/// Smooth weighted round-robin state over a route's upstreams.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    scores: Vec<i64>,
}

impl Selector {
    pub fn new(n: usize) -> Self {
        Self { scores: vec![0; n] }
    }

    /// The order in which to try the upstreams for one session (indexes into
    /// `candidates`); empty when none is available.
    pub fn plan(&mut self, candidates: &[Candidate]) -> Vec<usize> {
        if self.scores.len() != candidates.len() {
            self.scores = vec![0; candidates.len()];
        }
        let mut available: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].available)
            .collect();
        let Some(best) = available.iter().map(|&i| candidates[i].priority).min() else {
            return Vec::new();
        };
        let first = self.pick(candidates, best);
        // The rest: by priority, heaviest first, stable by index.
        available.sort_by_key(|&i| {
            (
                candidates[i].priority,
                std::cmp::Reverse(candidates[i].weight),
                i,
            )
        });
        let mut plan = Vec::with_capacity(available.len());
        plan.extend(first);
        plan.extend(available.into_iter().filter(|&i| Some(i) != first));
        plan
    }

    /// One smooth weighted round-robin pick among the available upstreams of
    /// `priority`. Weight 0 is never picked first (it only serves as a
    /// failover target), unless every weight of the priority is 0.
    fn pick(&mut self, candidates: &[Candidate], priority: u32) -> Option<usize> {
        let group: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].available && candidates[i].priority == priority)
            .collect();
        let total: i64 = group.iter().map(|&i| i64::from(candidates[i].weight)).sum();
        if total == 0 {
            return group.first().copied();
        }
        for &i in &group {
            self.scores[i] += i64::from(candidates[i].weight);
        }
        let chosen = *group
            .iter()
            .filter(|&&i| candidates[i].weight > 0)
            .max_by_key(|&&i| (self.scores[i], std::cmp::Reverse(i)))?;
        self.scores[chosen] -= total;
        Some(chosen)
    }
}

/// Each upstream's share of a route's `size` warm sockets: the available
/// upstreams of the best priority split it by weight ([`split`]); every
/// other upstream keeps none (a lower priority warms up only while the
/// better ones are unavailable).
pub fn pool_shares(size: usize, candidates: &[Candidate]) -> Vec<usize> {
    let best = candidates
        .iter()
        .filter(|c| c.available)
        .map(|c| c.priority)
        .min();
    let serving: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].available && Some(candidates[i].priority) == best)
        .collect();
    let weights: Vec<u32> = serving.iter().map(|&i| candidates[i].weight).collect();
    let shares = split(size, &weights);
    let mut out = vec![0; candidates.len()];
    for (k, &i) in serving.iter().enumerate() {
        out[i] = shares[k];
    }
    out
}

/// Splits `size` warm sockets across upstreams in proportion to `weights`
/// (largest remainders; ties to the earlier upstream). Weights all 0 split
/// evenly.
pub fn split(size: usize, weights: &[u32]) -> Vec<usize> {
    if weights.is_empty() {
        return Vec::new();
    }
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let weights: Vec<u64> = if total == 0 {
        vec![1; weights.len()]
    } else {
        weights.iter().map(|&w| u64::from(w)).collect()
    };
    let total: u64 = weights.iter().sum();
    let size = size as u64;
    let mut out: Vec<u64> = weights.iter().map(|w| size * w / total).collect();
    let mut left = size - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(size * weights[i] % total), i));
    for i in order {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out.into_iter().map(|n| n as usize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(priority: u32, weight: u32, available: bool) -> Candidate {
        Candidate {
            priority,
            weight,
            available,
        }
    }

    #[test]
    fn weights_three_to_one_pick_in_the_smooth_pattern() {
        let cs = [c(0, 3, true), c(0, 1, true)];
        let mut s = Selector::new(2);
        let firsts: Vec<usize> = (0..8).map(|_| s.plan(&cs)[0]).collect();
        assert_eq!(firsts, vec![0, 0, 1, 0, 0, 0, 1, 0]);
        // Failover from the first pick goes to the other.
        assert_eq!(s.plan(&cs), vec![0, 1]);
    }

    #[test]
    fn picks_follow_the_weights_over_many_sessions() {
        let cs = [c(0, 5, true), c(0, 2, true), c(0, 1, true)];
        let mut s = Selector::new(3);
        let mut counts = [0; 3];
        for _ in 0..800 {
            counts[s.plan(&cs)[0]] += 1;
        }
        assert_eq!(counts, [500, 200, 100]);
    }

    #[test]
    fn the_best_available_priority_serves_and_the_rest_follow_in_order() {
        let cs = [c(1, 1, true), c(0, 1, true), c(2, 5, true), c(1, 9, true)];
        let mut s = Selector::new(4);
        assert_eq!(s.plan(&cs), vec![1, 3, 0, 2]);
        // Priority 0 unavailable: priority 1 serves, by weight.
        let cs = [c(1, 1, true), c(0, 1, false), c(2, 5, true), c(1, 9, true)];
        let firsts: Vec<usize> = (0..10).map(|_| s.plan(&cs)[0]).collect();
        assert_eq!(firsts.iter().filter(|&&i| i == 3).count(), 9);
        assert_eq!(firsts.iter().filter(|&&i| i == 0).count(), 1);
        assert!(!s.plan(&cs).contains(&1), "an open upstream is never tried");
    }

    #[test]
    fn nothing_available_plans_nothing() {
        let mut s = Selector::new(2);
        assert!(s.plan(&[c(0, 1, false), c(1, 1, false)]).is_empty());
        assert!(s.plan(&[]).is_empty());
    }

    #[test]
    fn weight_zero_is_a_failover_target_only() {
        let cs = [c(0, 0, true), c(0, 1, true)];
        let mut s = Selector::new(2);
        for _ in 0..5 {
            assert_eq!(s.plan(&cs), vec![1, 0]);
        }
        let zeros = [c(0, 0, true), c(0, 0, true)];
        assert_eq!(s.plan(&zeros), vec![0, 1]);
    }

    #[test]
    fn warm_sockets_go_to_the_best_available_priority_by_weight() {
        let cs = [c(0, 3, true), c(0, 1, true), c(1, 5, true)];
        assert_eq!(pool_shares(8, &cs), vec![6, 2, 0]);
        let cs = [c(0, 3, false), c(0, 1, true), c(1, 5, true)];
        assert_eq!(pool_shares(8, &cs), vec![0, 8, 0]);
        let cs = [c(0, 3, false), c(0, 1, false), c(1, 5, true)];
        assert_eq!(pool_shares(8, &cs), vec![0, 0, 8]);
        assert_eq!(pool_shares(8, &[c(0, 1, false)]), vec![0]);
    }

    #[test]
    fn pool_size_splits_by_weight_with_largest_remainders() {
        assert_eq!(split(4, &[3, 1]), vec![3, 1]);
        assert_eq!(split(5, &[1, 1]), vec![3, 2]);
        assert_eq!(split(10, &[1, 2, 2]), vec![2, 4, 4]);
        assert_eq!(split(1, &[1, 3]), vec![0, 1]);
        assert_eq!(split(3, &[0, 0, 0]), vec![1, 1, 1]);
        assert_eq!(split(0, &[3, 1]), vec![0, 0]);
        assert_eq!(split(7, &[]), Vec::<usize>::new());
        for size in 0..50 {
            assert_eq!(split(size, &[7, 3, 1]).iter().sum::<usize>(), size);
        }
    }
}
