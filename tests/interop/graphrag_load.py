"""Loads a `graphloom export graphrag` directory with the `graphrag` package's
own query-side code and prints what the tests check, as one JSON object.

It reads the tables the way `graphrag query` does (a ParquetTableProvider
over a FileStorage, then DataReader's typing), turns them into GraphRAG's
data model with `graphrag.query.indexer_adapters`, and builds the local
search context (entities, relationships, sources) for the entity with the
most relationships, plus the global search context from the community
reports when the export has them. No LLM is needed for any of this; the
token counts use a whitespace tokenizer so nothing is downloaded.

Usage: python graphrag_load.py EXPORT_DIR
"""

import asyncio
import json
import sys

from graphrag.data_model import schemas
from graphrag.data_model.data_reader import DataReader
from graphrag.query.context_builder.community_context import build_community_context
from graphrag.query.context_builder.local_context import (
    build_entity_context,
    build_relationship_context,
)
from graphrag.query.context_builder.source_context import build_text_unit_context
from graphrag.query.indexer_adapters import (
    read_indexer_communities,
    read_indexer_entities,
    read_indexer_relationships,
    read_indexer_reports,
    read_indexer_text_units,
)
from graphrag_llm.tokenizer.tokenizer import Tokenizer
from graphrag_storage.file_storage import FileStorage
from graphrag_storage.tables.parquet_table_provider import ParquetTableProvider
import pandas as pd


FINAL_COLUMNS = {
    "entities": schemas.ENTITIES_FINAL_COLUMNS,
    "relationships": schemas.RELATIONSHIPS_FINAL_COLUMNS,
    "text_units": schemas.TEXT_UNITS_FINAL_COLUMNS,
    "documents": schemas.DOCUMENTS_FINAL_COLUMNS,
    "communities": schemas.COMMUNITIES_FINAL_COLUMNS,
    "community_reports": schemas.COMMUNITY_REPORTS_FINAL_COLUMNS,
}


class WordTokenizer(Tokenizer):
    """One token per whitespace-separated word (tiktoken would download its
    encoding; the counts only bound the context size here)."""

    def __init__(self, **kwargs):
        self._words = {}

    def encode(self, text):
        return [self._words.setdefault(w, len(self._words)) for w in text.split()]

    def decode(self, tokens):
        inverse = {v: k for k, v in self._words.items()}
        return " ".join(inverse[t] for t in tokens)


async def load(directory):
    provider = ParquetTableProvider(FileStorage(base_dir=directory))
    reader = DataReader(provider)
    tables = {
        "entities": await reader.entities(),
        "relationships": await reader.relationships(),
        "text_units": await reader.text_units(),
        "documents": await reader.documents(),
    }
    if await provider.has("communities"):
        tables["communities"] = await reader.communities()
        tables["community_reports"] = await reader.community_reports()
    return tables


def main(directory):
    tables = asyncio.run(load(directory))
    tokenizer = WordTokenizer()
    communities = tables.get("communities")
    if communities is None:
        communities = pd.DataFrame(columns=["community", "level", "entity_ids"])
    entities = read_indexer_entities(tables["entities"], communities, None)
    relationships = read_indexer_relationships(tables["relationships"])
    text_units = read_indexer_text_units(tables["text_units"])
    out = {
        "rows": {name: len(df) for name, df in tables.items()},
        "columns": {name: list(df.columns) for name, df in tables.items()},
        # GraphRAG's own column lists for its output tables: the export must
        # lead with exactly these, in this order.
        "final_columns_first": {
            name: list(tables[name].columns[: len(final)]) == final
            for name, final in FINAL_COLUMNS.items()
            if name in tables
        },
        "entities": len(entities),
        "relationships": len(relationships),
        "text_units": len(text_units),
        "described_entities": sum(1 for e in entities if e.description),
        "ended_relationships": [
            r.description for r in relationships if "(ended " in (r.description or "") or "(superseded " in (r.description or "")
        ],
        "titles_unique": len({e.title for e in entities}) == len(entities),
        "relationship_endpoints_known": all(
            r.source in {e.title for e in entities} and r.target in {e.title for e in entities}
            for r in relationships
        ),
    }
    if entities:
        top = max(entities, key=lambda e: (e.rank or 0, e.title))
        entity_text, _ = build_entity_context([top], tokenizer=tokenizer)
        rel_text, rel_df = build_relationship_context(
            [top], relationships, tokenizer=tokenizer, top_k_relationships=10
        )
        units = [u for u in text_units if u.id in set(top.text_unit_ids or [])]
        source_text, _ = build_text_unit_context(units, tokenizer=tokenizer)
        out["local_context"] = {
            "entity": top.title,
            "rank": top.rank,
            "entity_text": entity_text,
            "relationship_rows": len(rel_df),
            "relationship_text": rel_text,
            "source_units": len(units),
            "source_chars": len(source_text),
        }
    if "communities" in tables:
        reports = read_indexer_reports(tables["community_reports"], tables["communities"], None)
        built = read_indexer_communities(tables["communities"], tables["community_reports"])
        context, _ = build_community_context(
            community_reports=reports,
            entities=entities,
            tokenizer=tokenizer,
            use_community_summary=False,
            shuffle_data=False,
            include_community_rank=True,
            min_community_rank=0,
            max_context_tokens=4000,
            single_batch=True,
        )
        out["communities"] = len(built)
        out["community_levels"] = sorted({c.level for c in built})
        out["reports"] = len(reports)
        out["global_context_chars"] = sum(len(c) for c in context) if isinstance(context, list) else len(context)
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: graphrag_load.py EXPORT_DIR")
    main(sys.argv[1])
