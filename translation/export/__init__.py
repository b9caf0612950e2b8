"""A checkpoint turned into the formats people deploy NMT models with.

    python3 -m translation.export --checkpoint CKPT --format ctranslate2 --output DIR [--quantization int8]
    python3 -m translation.export --checkpoint CKPT --format huggingface --output DIR

Modules, one concept each:

* ``translation.export.ctranslate2``: our weights as a CTranslate2 ``TransformerSpec``
  (``to_ctranslate2``), with real SentencePiece pieces as its vocabulary.
* ``translation.export.huggingface``: our weights as a ``transformers.MarianMTModel``
  (``to_marian``) and the files ``MarianTokenizer`` reads (``write_huggingface``).
* ``translation.export.card``: the model card (``README.md``) written beside either.
* ``translation.export.__main__``: the command line.

``ctranslate2`` and ``transformers`` are the optional extra ``.[export]``
(``python3 -m pip install -e ".[export]"``); they are imported only when a format needs them.
"""
