"""The model artifact: the run folder (``runfolder``), what a model argument names
(``paths``) and the zoo of named base models (``zoo``)."""
