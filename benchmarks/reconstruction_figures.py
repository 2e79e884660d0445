"""FedIOD's Figure 7 at CPU scale: reconstructions and their error maps, one test slice per source, from
the models benchmarks/reconstruction_table.py trained (`fedistill.reproduce.reconstruction_figures`).

    python benchmarks/reconstruction_figures.py                 # after reconstruction_table.py
    python benchmarks/reconstruction_figures.py --runs OUT      # the table ran with --out OUT

Draws the table in <results> (`--table` names another) and writes <results>/reconstruction_figure7.png
(default benchmarks/results/).
"""

from __future__ import annotations

from fedistill.reproduce.reconstruction_figures import main

if __name__ == "__main__":
    main()
