"""The report: well-formed self-contained HTML, decodable figures, every section, headline numbers that
agree with the CSV files they come from, escaping of untrusted text; and the figure helpers.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from reports import figures, figures_heads, figures_precision, render, rundata
from reports.cluster import average_linkage

SECTIONS = ("headline", "model", "training", "properties", "saturation", "heads")
FIGURES = ("training", "saturation", "precision", "importance", "prune_curve", "estimators", "similarity", "head_roles",
           "attention_entropy", "patterns")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class StrictHTML(HTMLParser):
    """Collects ids, images and text, and fails on any tag closed out of order or left open."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.ids: list[str] = []
        self.images: list[dict] = []
        self.tags: set[str] = set()
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "img":
            self.images.append(a)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> StrictHTML:
    p = StrictHTML()
    p.feed(html)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed tags {p.stack}"
    return p


@pytest.fixture(scope="module")
def run(tiny_run):
    return tiny_run


@pytest.fixture(scope="module")
def page(run):
    return parse((run.run_dir / "report.html").read_text(encoding="utf-8"))


def test_html_is_well_formed_with_every_section(page):
    assert page.tags >= {"html", "head", "body", "table", "figure"}
    for section in SECTIONS:
        assert section in page.ids, section
    assert {f"fig-{f}" for f in FIGURES} <= set(page.ids)


def test_html_is_self_contained(run):
    html = (run.run_dir / "report.html").read_text(encoding="utf-8")
    # Renders offline from one file: no scripts, stylesheets, fonts or images fetched from anywhere.
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", html), re.findall(r'(?:src|href)="[^"]{0,40}', html)


def test_every_figure_decodes_as_a_png_of_sensible_size(run, page):
    assert len(page.images) == len(FIGURES)
    for img in page.images:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix)
        data = base64.b64decode(img["src"][len(prefix):], validate=True)
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # decodes every pixel: a truncated PNG fails here
            assert im.format == "PNG"
            w, h = im.size
            pixels = np.asarray(im.convert("L"), dtype=float)
        # Readable on a laptop: wider than a thumbnail, no wider than a large screen.
        assert 400 <= w <= 2000 and 200 <= h <= 2000, (img["alt"], w, h)
        assert (int(img["width"]), int(img["height"])) == (w, h)
        assert pixels.std() > 5, f"{img['alt']} looks blank"  # something was drawn
    for name in FIGURES:  # the same figures, as files, for report.md
        assert (run.run_dir / "figures" / f"{name}.png").stat().st_size > 5_000


def test_headline_agrees_with_the_csv_files(run, page):
    text = " ".join(" ".join(page.text).split())
    metrics = pd.read_csv(run.run_dir / "metrics.csv")
    acc = metrics["val_accuracy"].dropna().iloc[-1]
    assert f"{acc:.1%}".replace(".0%", "%") in text
    props = pd.read_csv(run.run_dir / "properties.csv")
    applicable = props[props["applicable"]]
    assert f"{int(applicable['passed'].astype(bool).sum())} / {len(applicable)}" in text
    red = json.loads((run.run_dir / "probes" / "redundancy.json").read_text())
    assert f"{red['prunable_fraction']:.1%}".replace(".0%", "%") in text
    roles = pd.read_csv(run.run_dir / "probes" / "head_roles.csv")
    n_induction = int((roles["induction"] > 0.5).sum())
    shown = re.search(r"(\S+) induction heads found", text)
    assert shown is not None and shown.group(1) == str(n_induction), text[:400]


def test_markdown_twin_has_every_section_and_links_existing_figures(run):
    md = (run.run_dir / "report.md").read_text(encoding="utf-8")
    for heading in ("## Headline", "## Model card", "## Training", "## Properties", "## Softmax saturation",
                    "## Heads"):
        assert heading in md
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(links) == sorted(f"figures/{f}.png" for f in FIGURES)
    for link in links:
        assert (run.run_dir / link).is_file()
    for block in re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M):  # every table keeps its column count
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in block.strip().splitlines()}
        assert len(widths) == 1, block


def test_untrusted_text_is_escaped(run, tmp_path):
    evil = tmp_path / "<script>alert(1)"
    evil.mkdir()
    # Only what the name and the properties table need: one figure keeps the render quick.
    shutil.copytree(run.run_dir / "checkpoint", evil / "checkpoint")
    for name in ("metrics.csv", "properties.csv"):
        shutil.copy(run.run_dir / name, evil / name)
    props = pd.read_csv(evil / "properties.csv", dtype={"counterexample": object})
    props.loc[0, "counterexample"] = "tokens=<img src=x onerror=alert(2)> | </td>"
    props.to_csv(evil / "properties.csv", index=False)
    paths = render.render(evil)
    html = paths.html.read_text(encoding="utf-8")
    assert "<script" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)" in html and "&lt;img src=x onerror=alert(2)&gt;" in html
    page = parse(html)  # the injected </td> did not break the table
    assert "<script>alert(1)" in " ".join(page.text)  # ... and reads as plain text
    md = paths.markdown.read_text(encoding="utf-8")
    assert "<script" not in md and "&lt;script&gt;alert(1)" in md
    assert "&lt;img src=x onerror=alert(2)&gt; \\| &lt;/td&gt;" in md


def test_stages_not_run_are_marked_with_their_command(run, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copytree(run.run_dir / "checkpoint", bare / "checkpoint")
    shutil.copy(run.run_dir / "metrics.csv", bare / "metrics.csv")
    paths = render.render(bare)
    page = parse(paths.html.read_text(encoding="utf-8"))
    text = " ".join(page.text)
    for command in ("attnlab check", "attnlab saturation --out", "attnlab probe"):
        assert command in text
    assert len(page.images) == 1  # training curves only
    assert set(SECTIONS) <= set(page.ids)
    assert "attnlab probe" in paths.markdown.read_text(encoding="utf-8")


def test_parameter_counts_match_torch(run):
    import harness

    model = harness.load_run(run.run_dir)
    counts = rundata.parameter_counts(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["mlp"] == 0  # the tiny run is attention-only


# --- helpers -------------------------------------------------------------------------------------
def test_average_linkage_matches_hand_computed_upgma():
    x = np.array([0.0, 1.0, 5.0, 6.0, 20.0])
    order, links = average_linkage(np.abs(x[:, None] - x[None, :]))
    # {0,1} and {2,3} at 1; then their mean pairwise distance (5+6+4+5)/4 = 5; then {4} at
    # (20+19+15+14)/4 = 17.
    assert [(a, b) for a, b, _ in links] == [(0, 1), (2, 3), (5, 6), (4, 7)]
    np.testing.assert_allclose([h for _, _, h in links], [1, 1, 5, 17])
    assert order == [4, 0, 1, 2, 3]  # each merge lists its first cluster's leaves first


def test_average_linkage_keeps_clusters_contiguous():
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1, 2], 4)
    rng.shuffle(labels)
    d = np.where(labels[:, None] == labels[None, :], 0.1, 0.9) + rng.random((12, 12)) * 0.01
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0)
    order, _ = average_linkage(d)
    runs = [labels[i] for i in order]
    assert sum(a != b for a, b in zip(runs[:-1], runs[1:], strict=True)) == 2  # three blocks, two boundaries


@pytest.mark.parametrize("bad", [np.zeros((2, 3)), np.array([[0, 1], [2, 0]]), np.array([[0, np.nan], [np.nan, 0]])])
def test_average_linkage_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        average_linkage(bad)


def test_loglog_slope_or_nan_recovers_a_power_law():
    d = np.array([8, 16, 32, 64])
    df = pd.DataFrame({"d_head": np.repeat(d, 2), "score_var": np.repeat(3.0 * d ** 1.0, 2)})
    assert figures.loglog_slope_or_nan(df, "score_var") == pytest.approx(1.0, abs=1e-9)


def test_figures_refuse_tables_without_their_columns():
    with pytest.raises(ValueError, match="val_accuracy"):
        figures.training_curves(pd.DataFrame({"step": [1], "lr": [1.0], "train_loss": [1.0], "val_loss": [1.0]}))
    with pytest.raises(ValueError, match="square"):
        figures_heads.similarity_clustermap(pd.DataFrame(np.zeros((2, 3))))


def test_md_escape_and_number_format():
    assert render.md_escape("a|b<c>&") == "a\\|b&lt;c&gt;&amp;"
    assert render.md_escape("two\nlines") == "two lines"
    assert render.fmt(float("nan")) == "—" and render.fmt(None) == "—"
    assert render.fmt(10000.0) == "10,000" and render.fmt(1e-5) == "1.000e-05" and render.fmt(0.123456) == "0.1235"
    assert render.pct(0.01) == "1%" and render.pct(0.125) == "12.5%"


def test_load_names_a_damaged_probe_file(run, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run.run_dir, bad)
    Path(bad / "probes" / "head_roles.csv").write_text("layer,head\n0,0\n")
    with pytest.raises(ValueError, match="head_roles.csv"):
        rundata.load(bad)


def test_prunable_by_accuracy_reads_the_curve_until_accuracy_first_drops():
    acc = {("importance", None): [1.0, 1.0, 0.995, 0.98, 1.0],  # recovers at 4, but it already fell at 3
           ("random", 0): [1.0, 0.97, 0.97, 0.5, 0.2],
           ("random", 1): [1.0, 1.0, 1.0, 1.0, 1.0]}
    rows = [{"order": o, "seed": s, "n_pruned": n, "fraction_pruned": n / 4, "loss": 1.0, "accuracy": a}
            for (o, s), accs in acc.items() for n, a in enumerate(accs)]
    got = rundata.prunable_by_accuracy(pd.DataFrame(rows), drop=0.01)
    assert got == {"importance": 2 / 4, "random": (0 / 4 + 4 / 4) / 2}


def test_unobservable_rows_are_shown_with_their_reason_and_not_counted_as_failures(run, tmp_path):
    # one row turned unobservable, as check_model writes it for a hook that never fires
    out = tmp_path / "unobservable"
    out.mkdir()
    shutil.copytree(run.run_dir / "checkpoint", out / "checkpoint")
    for name in ("metrics.csv", "properties.csv"):
        shutil.copy(run.run_dir / name, out / name)
    props = pd.read_csv(out / "properties.csv", dtype={"counterexample": object, "reason": object, "passed": object})
    row = props.index[props["status"] == "pass"][0]
    reason = "hook blocks.0.attn.hook_pattern exists but never fires on this model"
    props.loc[row, ["passed", "status", "reason", "worst"]] = [None, "unobservable", reason, float("nan")]
    props.to_csv(out / "properties.csv", index=False)
    paths = render.render(out)
    text = " ".join(" ".join(parse(paths.html.read_text(encoding="utf-8")).text).split())
    checked = props[props["status"].isin(["pass", "fail"])]
    assert f"{int((checked['status'] == 'pass').sum())} / {len(checked)}" in text
    assert f"unobservable: {props.loc[row, 'property']}" in text and reason in text
    md = paths.markdown.read_text(encoding="utf-8")
    assert f"| {props.loc[row, 'property']} | unobservable |" in md and reason in md


def test_precision_columns_and_figure(run, tmp_path):
    props = pd.read_csv(run.run_dir / "properties.csv")
    numeric = props[props["noise_floor"].notna() & props["status"].isin(["pass", "fail"])]
    assert len(numeric) >= 5 and (numeric["allowance"] > 0).all()
    assert np.allclose(numeric["ratio"], numeric["worst"] / numeric["allowance"])
    md = (run.run_dir / "report.md").read_text(encoding="utf-8")
    assert "| noise floor | allowance | ratio |" in md and "figures/precision.png" in md
    # the figure plots exactly the rows with a positive allowance and a finite deviation
    assert len(figures_precision.plotted_rows(props)) == int(((props["allowance"] > 0) & props["worst"].notna()
                                                              & props["status"].isin(["pass", "fail"])).sum())
    with pytest.raises(ValueError, match="no row has a positive allowance"):
        figures_precision.precision_margins(props.assign(allowance=0.0))


def test_properties_csv_from_before_the_precision_columns_still_renders(run, tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    shutil.copytree(run.run_dir / "checkpoint", out / "checkpoint")
    shutil.copy(run.run_dir / "metrics.csv", out / "metrics.csv")
    props = pd.read_csv(run.run_dir / "properties.csv").drop(columns=["noise_floor", "allowance", "ratio"])
    props.to_csv(out / "properties.csv", index=False)
    paths = render.render(out)
    assert not (out / "figures" / "precision.png").exists()  # nothing measured, nothing drawn
    assert "| noise floor |" in paths.markdown.read_text(encoding="utf-8")
