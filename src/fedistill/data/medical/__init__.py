"""Medical segmentation datasets of the FedIOD paper, and semi-synthetic stand-ins for them.

Real datasets, read from their released files (none can be downloaded automatically):
  brats              BraTS 2018-2023 whole tumour on 2D slices, Chang et al.'s protocol (brats.py)
  monuseg (tcga)     MoNuSeg/TCGA nuclei, Chang et al.'s cross-organ split or the challenge's (monuseg.py)
  cpm17 (cell17)     CPM-17 nuclei (cpm17.py)
  tnbc               TNBC nuclei (tnbc.py)
  nuclei-cross-site  CPM-17 + TCGA + TNBC, one site each (cross_site.py)
Semi-synthetic stand-ins (every number built on them is a semi-synthetic number):
  brats-synthetic-lesions   synthetic lesions in two real brains (brain_synthetic.py, lesions.py)
  mni152-synthetic-lesions  the same in nilearn's MNI152 template: needs no files (the demo set)
  brain-lesions-real        two patients' real lesions, test only
  nuclei-synthetic-sites    125 real nuclei composed into three differently stained sites
Patching and stitching of whole images: patches.py.

Targets: semantic segmentation (brains) has y in {0, 1} per pixel; instance segmentation (nuclei) has
instance ids per pixel, relabelled 1..n per patch. Modules import on first use (see the registry).
"""
