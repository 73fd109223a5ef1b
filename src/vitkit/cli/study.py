"""``vitkit study``: the paper's experiments, each a library study (``vitkit.studies.run_study``)."""

from __future__ import annotations

import argparse
import json

from ..files import check_output


def cmd_study(args: argparse.Namespace) -> int:
    from ..studies import get_study, list_studies
    from ..studies.base import default_folders, options_from, run_study, summary_lines

    if args.name == "list":
        studies = [(name, get_study(name).title) for name in list_studies()]
        if args.json:  # (the table was printed: every verb's --json is one JSON document)
            print(json.dumps([{"name": name, "title": title} for name, title in studies]))
        else:
            print("\n".join(f"{name:<22} {title}" for name, title in studies))
        return 0
    study = get_study(args.name)
    options = options_from(args)
    if options.dataset:  # before any folder is made (an unknown one was met by the first run, its config written)
        from ..data.datasets import FILE_DATASETS, canonical, file_split_dirs

        if (name := canonical(options.dataset)) in FILE_DATASETS:
            file_split_dirs(name, options.data_dir)
    work, out = default_folders(study, options)
    check_output(work, "folder", "--work")  # the results go there too unless --out names another folder
    if args.out is not None:
        check_output(out, "folder", "--out")
    results = run_study(study, options, say=(lambda line: None) if args.json else
                        (lambda line: print(line, flush=True)))
    if args.json:
        print(json.dumps({k: results[k] for k in ("study", "verdicts", "table")}))
        return 0
    print()
    for line in summary_lines(results):
        print(line)
    print(f"\nwrote {out / (study.name + '.json')}, {study.name}.md" + (", " + study.name + ".png" if
                                                                         "figure" in results else ""))
    return 0


def add_study(verb) -> None:
    p = verb("study", "the paper's experiments as studies: runs over seeds, a table, a figure and a verdict")
    p.add_argument("name", help="the study (list: name them)")
    from ..studies.base import add_options

    add_options(p)
    p.set_defaults(func=cmd_study)

