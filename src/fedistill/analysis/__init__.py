"""Analyses of what a federation gave away, above the algorithms they study: how close synthetic
images come to a site's private images (`similarity`), and the threat models of gradient-inversion
attacks on what crossed the boundary (`threat_models`)."""
