//! The report's chart (bench.png): flatnet/bridge per metric as bars
//! against their targets, and the font every chart of the bench is drawn
//! with. Apart from the tables, as plotters is needed for it alone.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::{
    BLACK, BLUE, BitMapBackend, ChartBuilder, Color, FontStyle, IntoDrawingArea, PathElement,
    RGBColor, Rectangle, Text, WHITE,
};

use super::rows::{Bound, Row};

/// DejaVuSans as the charts' "sans-serif", registered once per process.
pub(crate) fn register_font() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if REGISTERED.get().is_some() {
        return Ok(());
    }
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("the chart needs DejaVuSans (Debian package fonts-dejavu-core)")?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("DejaVuSans.ttf is not a usable font"))?;
    let _ = REGISTERED.set(true);
    Ok(())
}

/// The chart of `rows`' ratios to the bridge, written to `path`.
pub(super) fn chart(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let ratios: Vec<([&str; 2], f64, Option<Bound>)> = rows
        .iter()
        .filter(|r| !r.vs_bridge.is_nan())
        .map(|r| (r.chart_label, r.vs_bridge, r.target_bridge))
        .collect();
    let top = ratios.iter().map(|(_, v, _)| *v).fold(1.5_f64, f64::max) * 1.15;
    let root = BitMapBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "flatnet (tc) / kernel bridge: median ratio per metric (bars), target (black tick), 1.0 (blue)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(10)
        .y_label_area_size(60)
        // Below zero: room for the bars' labels.
        .build_cartesian_2d(0f64..ratios.len() as f64, -top * 0.16..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("flatnet / bridge")
        .label_style(("sans-serif", 16))
        .draw()?;
    for (i, (label, ratio, bound)) in ratios.iter().enumerate() {
        let x = i as f64;
        let color = match bound {
            Some(b) if b.met(*ratio) => RGBColor(46, 139, 87),
            Some(_) => RGBColor(200, 60, 50),
            None => RGBColor(120, 120, 120),
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, *ratio)],
            color.filled(),
        )))?;
        if let Some(Bound::AtMost(limit) | Bound::AtLeast(limit)) = bound {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x + 0.1, *limit), (x + 0.9, *limit)],
                BLACK.stroke_width(3),
            )))?;
        }
        chart.draw_series(std::iter::once(Text::new(
            format!("{ratio:.2}"),
            (x + 0.35, ratio + top * 0.02),
            ("sans-serif", 16),
        )))?;
        for (line, text) in label.iter().enumerate() {
            chart.draw_series(std::iter::once(Text::new(
                text.to_string(),
                (x + 0.08, -top * (0.03 + 0.06 * line as f64)),
                ("sans-serif", 14),
            )))?;
        }
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 1.0), (ratios.len() as f64, 1.0)],
        BLUE.mix(0.4),
    )))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 0.0), (ratios.len() as f64, 0.0)],
        BLACK,
    )))?;
    root.present()?;
    Ok(())
}
