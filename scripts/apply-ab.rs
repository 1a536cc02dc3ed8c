//! The timing loop of `scripts/apply-ab`: the two revisions of the ledger (crates `a` and `b`)
//! run alternately, A first in even pairs and B first in odd ones, so neither side always
//! follows the other; prints each side's median and best, and the median of the paired
//! ratios B/A (above 1: B is faster).

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|x, y| x.total_cmp(y));
    values[values.len() / 2]
}

fn best(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::MIN, f64::max)
}

fn main() {
    let pairs: usize = std::env::var("PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(60);
    for random_ids in [false, true] {
        let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..pairs {
            let (ra, rb) = if pair % 2 == 0 {
                let ra = a::apply_ab::run(random_ids);
                (ra, b::apply_ab::run(random_ids))
            } else {
                let rb = b::apply_ab::run(random_ids);
                (a::apply_ab::run(random_ids), rb)
            };
            a.push(ra);
            b.push(rb);
            ratios.push(rb / ra);
        }
        println!(
            "{} request ids: A median {:.3} best {:.3} | B median {:.3} best {:.3} M commands/s | B/A paired median {:.3}",
            if random_ids { "UUID   " } else { "counter" },
            median(&mut a.clone()),
            best(&a),
            median(&mut b.clone()),
            best(&b),
            median(&mut ratios),
        );
    }
}
