//! A bare round trip's median: `samples` calls one after another, each timed alone. The floor
//! under a command's latency, for Tally (`Admin.ClockProbe`) and etcd (a serializable `Range`)
//! alike, so both are measured the same way.

use std::future::Future;

use hdrhistogram::Histogram;
// Tokio's clock: the same as the system's in a run, and paused in the test, so the test's
// pauses are measured exactly however busy the machine is.
use tokio::time::Instant;

/// The median of `samples` sequential calls of `call`, in milliseconds.
pub async fn sequential_p50_ms<F, Fut, T, E>(samples: usize, mut call: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    anyhow::Error: From<E>,
{
    anyhow::ensure!(samples > 0, "a round trip needs at least one sample");
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for _ in 0..samples {
        let began = Instant::now();
        call().await?;
        h.record((began.elapsed().as_micros() as u64).max(1))?;
    }
    Ok(h.value_at_quantile(0.5) as f64 / 1_000.0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_median_is_of_the_calls_and_a_failed_call_is_an_error() {
        let mut n = 0u64;
        let p50 = sequential_p50_ms(5, || {
            n += 1;
            // 1, 2, ... 5 ms: the median call takes 3.
            let pause = Duration::from_millis(n);
            async move {
                tokio::time::sleep(pause).await;
                anyhow::Ok(())
            }
        })
        .await
        .expect("measured");
        assert!((3.0..4.5).contains(&p50), "{p50}");
        let failed = sequential_p50_ms(3, || async { Err::<(), _>(anyhow::anyhow!("down")) }).await;
        assert!(failed.is_err());
        assert!(sequential_p50_ms(0, || async { anyhow::Ok(()) })
            .await
            .is_err());
    }
}
