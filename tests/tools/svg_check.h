// A small well-formedness check of the SVG documents the tools write: every tag closed in order,
// one root <svg> with the SVG namespace, attributes quoted, '&' only as one of XML's five
// entities; and the attributes of every <polyline>, for the tests to find series by data-*.
#pragma once

#include <cstddef>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace zinf::test {

struct SvgDocument {
    std::string error;  // empty: well-formed
    std::vector<std::map<std::string, std::string>> polylines;
    // The number of "x,y" pairs in a polyline's points attribute.
    static std::size_t point_count(const std::map<std::string, std::string>& polyline) {
        const auto it = polyline.find("points");
        if (it == polyline.end()) return 0;
        std::istringstream in(it->second);
        std::size_t n = 0;
        for (std::string pair; in >> pair;) n += pair.find(',') != std::string::npos ? 1 : 0;
        return n;
    }
};

inline bool entities_valid(const std::string& text) {
    for (std::size_t at = text.find('&'); at != std::string::npos; at = text.find('&', at + 1)) {
        bool ok = false;
        for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
            ok = ok || text.compare(at, std::string(e).size(), e) == 0;
        }
        if (!ok) return false;
    }
    return true;
}

// Parses `<name a="v" ...>` (the text between '<' and '>'); false when malformed.
inline bool parse_tag(const std::string& body, std::string& name,
                      std::map<std::string, std::string>& attributes) {
    std::size_t at = 0;
    while (at < body.size() && body[at] != ' ' && body[at] != '\n') ++at;
    name = body.substr(0, at);
    while (true) {
        while (at < body.size() && (body[at] == ' ' || body[at] == '\n')) ++at;
        if (at >= body.size()) return !name.empty();
        const auto eq = body.find('=', at);
        if (eq == std::string::npos || eq + 1 >= body.size() || body[eq + 1] != '"') return false;
        const auto close = body.find('"', eq + 2);
        if (close == std::string::npos) return false;
        const std::string value = body.substr(eq + 2, close - eq - 2);
        if (!entities_valid(value) || value.find('<') != std::string::npos) return false;
        attributes[body.substr(at, eq - at)] = value;
        at = close + 1;
    }
}

inline SvgDocument check_svg(const std::string& text) {
    SvgDocument doc;
    std::vector<std::string> open;
    bool root_seen = false;
    std::size_t at = 0;
    while (doc.error.empty()) {
        const auto lt = text.find('<', at);
        const std::string between =
            text.substr(at, lt == std::string::npos ? std::string::npos : lt - at);
        if (!entities_valid(between)) doc.error = "a bare '&' in text near " + between;
        if (lt == std::string::npos) break;
        if (text.compare(lt, 2, "<?") == 0) {
            at = text.find("?>", lt);
            if (at == std::string::npos) doc.error = "unterminated <?";
            at += 2;
            continue;
        }
        const auto gt = text.find('>', lt);
        if (gt == std::string::npos) {
            doc.error = "unterminated tag";
            break;
        }
        std::string body = text.substr(lt + 1, gt - lt - 1);
        at = gt + 1;
        if (!body.empty() && body[0] == '/') {
            if (open.empty() || open.back() != body.substr(1)) doc.error = "stray </" + body;
            if (!open.empty()) open.pop_back();
            continue;
        }
        const bool self_closing = !body.empty() && body.back() == '/';
        if (self_closing) body.pop_back();
        std::string name;
        std::map<std::string, std::string> attributes;
        if (!parse_tag(body, name, attributes)) {
            doc.error = "malformed tag <" + body + ">";
            break;
        }
        if (open.empty()) {
            if (root_seen || name != "svg") doc.error = "a second root or a root not <svg>";
            if (attributes["xmlns"] != "http://www.w3.org/2000/svg") doc.error = "no xmlns";
            root_seen = true;
        }
        if (name == "polyline") doc.polylines.push_back(attributes);
        if (!self_closing) open.push_back(name);
    }
    if (doc.error.empty() && !open.empty()) doc.error = "<" + open.back() + "> not closed";
    if (doc.error.empty() && !root_seen) doc.error = "no <svg> root";
    return doc;
}

}  // namespace zinf::test
