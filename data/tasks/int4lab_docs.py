"""lm-eval glue for the int4lab gate tasks: documents come from int4lab.gate.documents (data/corpus/)."""
import re


def _dataset(split):
    import datasets
    from int4lab.gate.texts import documents
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"page": documents(split)})})


def test_docs(**_metadata):
    return _dataset("test")


def ood_docs(**_metadata):
    return _dataset("ood")


def page(doc):
    return doc["page"]


def process_results(doc, results):
    # Words and bytes of the scored text itself (no detokenisation step, unlike wikitext).
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["page"].strip()))
    nbytes = len(doc["page"].encode("utf-8"))
    return {"word_perplexity": (loglikelihood, words), "byte_perplexity": (loglikelihood, nbytes),
            "bits_per_byte": (loglikelihood, nbytes)}
