"""LangChain's own standard suites (the `langchain-tests` package, as LangChain's integrations run
them) against the LangChain adapters: RetrieversIntegrationTests for SemsearchRetriever,
VectorStoreIntegrationTests for SemsearchVectorStore, each on a real index with the real model.

The suites' async tests are plain `async def` methods: this module marks them for pytest-asyncio
(whose strict mode, the project's, runs only marked tests on a loop); the mark's warning on the
suites' sync tests is silenced here rather than switching the whole project to auto mode."""
from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")
pytest.importorskip("pytest_asyncio")

from langchain_tests.integration_tests import RetrieversIntegrationTests, VectorStoreIntegrationTests  # noqa: E402

from semsearch.indexing import index_corpus  # noqa: E402
from semsearch.integrations.langchain import SemsearchRetriever, SemsearchVectorStore  # noqa: E402
from semsearch.search import Retriever  # noqa: E402

from conftest import SAMPLE  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.xdist_group("test_langchain_standard"),  # one worker sets the fixture up
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async function")]


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, real_encoder):
    folder = tmp_path_factory.mktemp("lc-standard") / "idx"
    index_corpus(SAMPLE, folder, real_encoder, progress=False)
    r = Retriever.load(folder, encoder=real_encoder)
    yield r
    r.close()


class TestSemsearchRetrieverStandard(RetrieversIntegrationTests):
    semsearch: Retriever | None = None

    @pytest.fixture(autouse=True)
    def _index(self, sample_index):
        type(self).semsearch = sample_index

    @property
    def retriever_constructor(self) -> type[SemsearchRetriever]:
        return SemsearchRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"retriever": type(self).semsearch, "k": 4}

    @property
    def retriever_query_example(self) -> str:
        return "how long does a personal loan decision take"


class TestSemsearchVectorStoreStandard(VectorStoreIntegrationTests):
    """Each test gets an empty index in its own folder (semsearch embeds with the index's own
    model, so the suite's fake embeddings are not used)."""

    @pytest.fixture
    def vectorstore(self, tmp_path, real_encoder):
        store = SemsearchVectorStore.from_index(tmp_path / "idx", encoder=real_encoder)
        try:
            yield store
        finally:
            store.retriever.close()
